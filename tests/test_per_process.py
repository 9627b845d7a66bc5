"""Per process, not per step: one cancel-notice subscriber and one bounded event publisher.

Against private ``redis-server`` processes the tests own (paused, restarted, killed), and
real worker processes (``tests/processes/concurrent_steps.py``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from agentloop import live_events as events
from agentloop.messages import TextDelta, ToolCallDelta
from agentloop.models import Chat
from agentloop.process import cancel_notices as _cancel_notices
from agentloop.process.cancel_notices import RedisCancelListener, covers, listen_locally
from agentloop.process.event_publisher import publisher
from agentloop.testing import stream
from tests.helpers import wait_until
from tests.processes import run_script, start_script, summary
from tests.redis_server import RedisServer, private_redis

#: generous bound of every wait (a loaded 2-core machine).
DEADLINE = 60.0


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    with private_redis(tmp_path) as server:
        yield server


@pytest.fixture
def on_private_redis(redis_server, settings) -> Iterator[RedisServer]:
    """This process's agentloop on the private server (a long socket timeout: a paused
    server makes a publish wait, it doesn't fail it)."""
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "REDIS_URL": redis_server.url(socket_timeout=120),
        "REDIS_PREFIX": "perprocess",
    }
    yield redis_server
    if redis_server.paused:
        redis_server.resume()
    events.flush()
    _cancel_notices.stop_subscribers()


# -- one cancel-notice subscriber per process -----------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_many_concurrent_steps_share_one_subscriber_and_a_cancel_reaches_them(
    redis_server, settings, user
):
    url = redis_server.url()
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_URL": url}
    chats = [Chat.objects.create(model="rules:test", owner=user) for _ in range(8)]
    for number, chat in enumerate(chats):
        # 2400 chunks 50 ms apart: 2 minutes, unless a cancel stops it (only a notice can:
        # the flag is read every 600 s).
        chat.ask_later(f"stream:2400:0.05 chat-{number}")  # the worker below runs its step
        Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it
    worker_settings = {"REDIS_URL": url, "CANCEL_POLL_INTERVAL": 600, "PARTIAL_SAVE_INTERVAL": 0.2}
    worker = start_script(
        "concurrent_steps.py",
        *(chat.pk for chat in chats),
        env={"AGENTLOOP_TEST_SETTINGS": json.dumps(worker_settings)},
    )
    try:
        pid = int(worker.stdout.readline().split()[1])
        wait_until(
            lambda: all(
                chat.messages.filter(role="assistant", status="partial").exists() for chat in chats
            ),
            "every step to stream",
        )
        connections = redis_server.connections_of(pid)
        first, *others = chats

        Chat.objects.get(pk=first.pk).cancel()  # from this process, as the cancel view does

        wait_until(
            lambda: first.usage_records.filter(status="cancelled").exists(),
            "the cancelled step to stop",
        )
        assert not any(chat.usage_records.exists() for chat in others)  # they stream on
        for chat in others:
            Chat.objects.get(pk=chat.pk).cancel()
        output, errors = worker.communicate(timeout=DEADLINE)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()  # reaps it and closes its pipes
    assert set(summary(output)["actions"].values()) == {"cancelled"}, errors
    names = [connection["name"] for connection in connections]
    assert names.count(f"agentloop-cancel-notices-{pid}") == 1
    # The subscriber and the event publisher; not a connection per step.
    assert len(connections) <= 3, connections


def test_the_subscriber_hears_cancels_again_after_redis_restarts(on_private_redis):
    chat = Chat(pk=4242)  # a chat key is all a notice needs
    notice = listen_locally(chat)
    with RedisCancelListener(chat, notice) as listener:
        hears_a_cancel(on_private_redis, listener)

        on_private_redis.restart()

        hears_a_cancel(on_private_redis, listener)


def test_a_redis_outage_is_one_warning_line_for_the_subscriber(on_private_redis, caplog):
    """An operator restarting Redis sees one line saying what failed, no traceback."""
    chat = Chat(pk=4343)
    notice = listen_locally(chat)
    with RedisCancelListener(chat, notice) as listener:
        hears_a_cancel(on_private_redis, listener)
        caplog.set_level(logging.WARNING, logger="agentloop")
        on_private_redis.stop()

        def warned() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith("Cancel notices:")]

        try:
            wait_until(warned, "the subscriber's warning")
        finally:
            on_private_redis.start()
        hears_a_cancel(on_private_redis, listener)

    (record,) = warned()  # once per outage, however many tries it took
    assert record.levelno == logging.WARNING and record.exc_info is None
    message = record.getMessage()
    assert "\n" not in message
    assert "ConnectionError" in message and "retrying" in message, message


def hears_a_cancel(server: RedisServer, listener: RedisCancelListener) -> None:
    """Publish the chat's cancel message (as another process's cancel does) until the
    listener's notice is set: a subscriber still reconnecting misses what comes before."""
    listener.notice.clear()

    def published_and_heard() -> bool:
        try:
            with server.client() as client:
                client.publish(listener.channel, "cancel")
        except Exception:  # noqa: S110 - the server is still starting
            pass
        return listener.notice.wait(0.2)

    wait_until(published_and_heard, "the cancel notice")


def test_a_forked_child_gets_a_subscriber_of_its_own(on_private_redis):
    parent_chat, child_chat = Chat(pk=1), Chat(pk=2)
    with RedisCancelListener(parent_chat, listen_locally(parent_chat)) as parent_listener:
        parents = _cancel_notices.subscriber()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
            pid = os.fork()
        if pid == 0:  # the child: a subscriber of its own hears its chat's cancels
            code = 1
            try:
                with RedisCancelListener(child_chat, listen_locally(child_chat)) as listener:
                    own = _cancel_notices.subscriber()
                    if own is not parents and own.pubsub is not parents.pubsub:
                        hears_a_cancel(on_private_redis, listener)
                        code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)

        assert os.waitstatus_to_exitcode(status) == 0
        hears_a_cancel(on_private_redis, parent_listener)  # the child left the parent's alone


# -- a live subscription stands in for the throttled flag reads ----------------------------
def test_a_notice_covers_its_run_only_while_the_subscription_stands(on_private_redis):
    """From its registration on, a worker's notice covers its run (a cancel published later
    reaches it), not before; a Redis that stops answering (paused: the connection looks
    fine) or restarts ends it; after a restart only what comes after the new subscription is
    covered."""

    chat = Chat(pk=4343)
    notice = listen_locally(chat)
    before = time.monotonic()
    with RedisCancelListener(chat, notice) as listener:
        hears_a_cancel(on_private_redis, listener)  # subscribed and confirmed
        now = time.monotonic()
        assert covers(notice, now)
        assert not covers(notice, before)  # registered after that

        on_private_redis.pause()
        try:
            subscriber = _cancel_notices.subscriber()
            wait_until(lambda: not covers(notice, now), "the silent Redis to end the cover")
        finally:
            on_private_redis.resume()
        wait_until(lambda: covers(notice, now), "the answers to come back")

        on_private_redis.restart()
        hears_a_cancel(on_private_redis, listener)
        assert not covers(notice, now)  # a cancel during the restart went unheard
        assert covers(notice, time.monotonic())
        assert subscriber.live_since is not None and subscriber.live_since > now
    assert not covers(notice, time.monotonic())  # the run is over: its checkpoints poll


def _flag_reads(
    chat: Chat, redis_url: str | None, settings: Any, *, in_process: bool = False
) -> tuple[str, int]:
    """One step of ``chat`` streaming 12 chunks 50 ms apart, with throttled checkpoints due
    every 20 ms (a background job, or ``ask()`` in this process as a view runs it): how it
    ended and how many times it read the cancel flag."""
    from django.test.utils import CaptureQueriesContext

    from agentloop.runners import run_step

    agentloop = {**settings.AGENTLOOP, "CANCEL_POLL_INTERVAL": 0.02}
    agentloop.pop("REDIS_URL", None)
    if redis_url is not None:
        agentloop |= {"REDIS_URL": redis_url, "REDIS_PREFIX": "perprocess"}
    settings.AGENTLOOP = agentloop
    if redis_url is not None:
        _cancel_notices.subscriber()
        wait_until(
            lambda: _cancel_notices.subscriber().live_at(time.monotonic()), "the subscription"
        )
    with CaptureQueriesContext(connections["default"]) as queries:
        if in_process:
            action = chat.ask("stream:12:0.05 hi", stream=lambda chunk: None).status
        else:
            chat.ask_later("stream:12:0.05 hi")
            Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() does
            action = run_step(chat.pk).action
    reads = [q for q in queries if "halt_reason" in q["sql"] and q["sql"].startswith("SELECT")]
    return action, len(reads)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_process", [False, True], ids=["job", "ask"])
def test_a_verb_heard_by_a_live_subscription_reads_the_flag_at_forced_checkpoints_only(
    redis_server, settings, user, in_process
):
    """Throttled checkpoints between streamed chunks read the cancel flag (a pool check-out
    and a query each, 0.02 s apart here) unless the process's subscription hears the verb's
    chat, a worker's step or a web request's ``ask()``: then a cancel would set its notice,
    and they read nothing."""
    polled = Chat.objects.create(model="rules:test", owner=user)
    covered = Chat.objects.create(model="rules:test", owner=user)
    try:
        ended, polls = _flag_reads(polled, None, settings, in_process=in_process)
        covered_ended, covered_polls = _flag_reads(
            covered, redis_server.url(), settings, in_process=in_process
        )
    finally:
        _cancel_notices.stop_subscribers()
    assert ended == covered_ended == ("complete" if in_process else "done")
    assert polls >= 5  # a read per 50 ms chunk, the throttle's 20 ms having passed
    assert covered_polls == 0


@pytest.mark.django_db(transaction=True)
def test_a_cancel_from_another_process_stops_an_ask_in_this_one_at_once(
    on_private_redis, settings, user
):
    """A web request's streamed ``ask()`` hears a cancel made in another process (a Redis
    message) and stops at the next chunk: the flag is polled only every 600 s here, and the
    heartbeat, which reads it too, renews the lease every 200 s."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "CANCEL_POLL_INTERVAL": 600, "LEASE_SECONDS": 600}
    chat = Chat.objects.create(model="rules:test", owner=user)
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            # Two minutes, streamed to the page, unless a cancel stops it.
            chat.ask("stream:2400:0.05 long", stream=lambda chunk: None)
        except Exception as exc:  # noqa: BLE001 - the outcome is the test's to judge
            outcome["error"] = exc
        finally:
            connections.close_all()

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        wait_until(
            lambda: chat.messages.filter(role="assistant", status="partial").exists(),
            "the answer to stream",
        )
        remote = {"REDIS_URL": on_private_redis.url(), "REDIS_PREFIX": "perprocess"}
        done = run_script(
            "cancel_chat.py", chat.pk, env={"AGENTLOOP_TEST_SETTINGS": json.dumps(remote)}
        )
        asking.join(DEADLINE)
        stopped = not asking.is_alive()
    finally:
        if asking.is_alive():  # don't leave it streaming for two minutes
            Chat.objects.get(pk=chat.pk).cancel()
            asking.join(DEADLINE)
    assert summary(done.stdout) == {"cancelled": True}, done.stderr
    assert stopped  # by the other process's cancel, not by this test's own
    assert type(outcome.get("error")).__name__ == "CancelledError"
    assert chat.usage_records.get().status == "cancelled"


# -- one bounded event publisher per process -------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_step_finishes_while_redis_hangs_and_its_events_arrive_after(
    on_private_redis, chat, scripted
):
    words = [f"w{number} " for number in range(100)]
    scripted.add(stream(*words))
    chat.ask_later("Tell me")
    assert events.flush()
    on_private_redis.pause()

    def publish(chunk: Any) -> None:
        events.publish_chunk(chat, chunk)

    done = threading.Event()

    def run() -> None:
        try:
            chat.complete(stream=publish)
            done.set()
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    # Each publish would wait for the hung server (up to its 120 s socket timeout): the step
    # waits on none.
    finished = done.wait(DEADLINE)
    still_paused = on_private_redis.paused
    on_private_redis.resume()
    runner.join()

    assert finished and still_paused
    assert events.flush(DEADLINE)
    kept = read_all(chat)
    assert [e["data"]["text"] for e in kept if e["type"] == "chunk"] == words
    assert [e["data"]["role"] for e in kept if e["type"] == "message"] == ["user", "assistant"]
    assert kept[-1]["data"]["content"] == "".join(words)


@pytest.mark.django_db
def test_a_full_queue_merges_text_chunks_and_loses_no_text(on_private_redis, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_QUEUE_SIZE": 3}
    before = publisher().dropped
    on_private_redis.pause()
    words = [f"w{number} " for number in range(50)]
    for word in words:
        events.publish_chunk(chat, TextDelta(text=word))
    on_private_redis.resume()

    assert events.flush(DEADLINE)
    chunks = [e["data"]["text"] for e in read_all(chat)]
    assert "".join(chunks) == "".join(words)
    assert len(chunks) < len(words)  # those in flight when the server paused, and the queue's 3
    assert publisher().dropped == before


@pytest.mark.django_db
def test_with_a_healthy_redis_every_chunk_arrives_in_order(on_private_redis, user):
    chats = [Chat.objects.create(model="scripted:test", owner=user) for _ in range(3)]
    sent: dict[int, list[str]] = {chat.pk: [] for chat in chats}
    for number in range(300):
        chat = chats[number % 3]
        text = f"{number} "
        events.publish_chunk(chat, TextDelta(text=text))
        sent[chat.pk].append(text)

    assert events.flush(DEADLINE)
    for chat in chats:
        assert [e["data"]["text"] for e in read_all(chat)] == sent[chat.pk]


@pytest.mark.django_db
def test_a_full_queue_drops_chunks_before_messages(on_private_redis, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_QUEUE_SIZE": 3}
    on_private_redis.pause()
    before = publisher().dropped
    for _ in range(10):  # tool call deltas aren't merged: dropped when the queue is full
        events.publish_chunk(chat, ToolCallDelta(id="c", name="add", arguments="{}"))
    chat.ask_later("a message")  # pushes out the oldest queued event instead
    on_private_redis.resume()

    assert events.flush(DEADLINE)
    kinds = [e["type"] for e in read_all(chat)]
    assert kinds[-1] == "message"
    assert publisher().dropped > before
    assert kinds.count("tool_call_delta") < 10  # in flight at the pause, and the queue's


class _Recording:
    """An event backend that keeps what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def publish_batch(self, batch: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.sent.extend(batch)


def test_events_discarded_while_the_sender_lingers_leave_it_sending(monkeypatch):
    """A chat deleted in the 2 ms the sender waits for a batch to gather takes every queued
    event with it: the sender finds nothing to send, and goes on with the next events."""
    from agentloop.process import event_publisher
    from agentloop.process.event_publisher import Publisher

    monkeypatch.setattr(event_publisher, "LINGER", 0.3)  # wide enough to discard within
    backend, sender = _Recording(), Publisher()
    sender.put(backend, "deleted", "chunk", {"text": "gone"}, size=10)
    time.sleep(0.1)  # the sender woke for it, and lingers
    sender.discard(backend, "deleted")
    time.sleep(0.4)  # it found the queue empty
    sender.put(backend, "kept", "message", {"id": 1}, size=10)

    assert sender.flush(DEADLINE)
    assert backend.sent == [("kept", "message", {"id": 1})]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sender_that_died_is_started_again_by_the_next_event(monkeypatch):
    """A bug that kills the sending thread costs the batch it held, not every later event."""
    from agentloop.process.event_publisher import Publisher

    backend, sender = _Recording(), Publisher()
    real_forget = Publisher._forget
    faults = iter([RuntimeError("a bug in the sender")])

    def forget_once_failing(self: Publisher, event: Any) -> None:
        fault = next(faults, None)
        if fault is not None:
            raise fault
        real_forget(self, event)

    monkeypatch.setattr(Publisher, "_forget", forget_once_failing)
    sender.put(backend, "chat", "chunk", {"text": "lost with the thread"}, size=10)
    first = sender._thread
    assert first is not None
    first.join(DEADLINE)
    assert not first.is_alive()

    sender.put(backend, "chat", "message", {"id": 1}, size=10)
    assert sender._thread is not first
    assert sender.flush(DEADLINE)
    assert backend.sent == [("chat", "message", {"id": 1})]


def read_all(chat: Chat) -> list[dict[str, Any]]:
    """Every event of the chat's stream (a read returns at most ``events.READ_COUNT``)."""
    backend, found, after = events.get_backend(), [], None
    while batch := backend.read(events.chat_key(chat), after=after, timeout=0.01):
        found += batch
        after = batch[-1]["id"]
    return found
