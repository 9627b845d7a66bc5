"""Live streams per user (``EVENTS_STREAMS_PER_USER``, ``agentloop.web._access``) and what
open streams cost a process (``agentloop.process.stream_reader``, ``shared_reads``).

Before the cap, one user's hundred resume streams took a process's Redis connections from 13
to 114 and made 242 database transactions a second. Now: past the cap a 429 (nothing written),
another user still streams; async streams share one Redis connection per event loop; the
streams of one chat share their reads of it. The cap is counted in Redis across processes
(checked against a real uvicorn process), else per process.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test import AsyncClient, Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentloop import live_events as events
from agentloop.models import Chat, ChatState, Message
from agentloop.web._access import slot_seconds
from tests.sse_reading import (
    DEADLINE,
    AsyncReader,
    Reader,
    events_url,
    is_state,
    session_cookie,
    uvicorn_serving,
)

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 2
TOO_MANY = f"Too many live streams open: at most {CAP} per user. Close one and try again."


@pytest.fixture
def capped(settings):
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "EVENTS_STREAMS_PER_USER": CAP,
        "EVENTS_POLL_INTERVAL": 0.05,
        "EVENTS_KEEPALIVE": 30.0,
    }


@pytest.fixture(params=["database", "redis"])
def backend(request) -> str:
    if request.param == "redis":
        request.getfixturevalue("redis_events")
    return request.param


def open_events(client: Client, chat: Chat) -> Reader:
    response = client.get(events_url(chat))
    assert response.status_code == 200, response
    reader = Reader(response)
    reader.until(is_state)  # it streams
    return reader


def usechat_body(chat: Chat, text: str) -> str:
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return json.dumps({"id": str(chat.pk), "messages": [message]})


def test_past_the_cap_a_user_gets_a_429_while_another_still_streams(
    capped, backend, user, owner, chat, django_user_model
):
    readers = [open_events(owner, chat) for _ in range(CAP)]

    refused = owner.get(events_url(chat))
    assert (refused.status_code, refused.content.decode()) == (429, TOO_MANY)
    # The useChat views are refused before they write anything: the message is not lost
    # half-way, it is not taken at all.
    posted = owner.post(
        reverse("agentloop:usechat"), usechat_body(chat, "Hi"), content_type="application/json"
    )
    assert (posted.status_code, posted.content.decode()) == (429, TOO_MANY)
    run_input = {
        "threadId": str(chat.pk),
        "runId": "r",
        "messages": [{"id": "m1", "role": "user", "content": "Hi"}],
    }
    ag_ui = owner.post(
        reverse("agentloop:ag-ui"), json.dumps(run_input), content_type="application/json"
    )
    assert (ag_ui.status_code, ag_ui.content.decode()) == (429, TOO_MANY)  # AG-UI: the same
    assert not Message.objects.filter(chat=chat).exists()
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.RUNNING)  # something to resume
    resumed = owner.get(reverse("agentloop:usechat-stream", args=[chat.pk]))
    assert resumed.status_code == 429
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.IDLE)

    grace = django_user_model.objects.create_user(username="grace", password="pw")
    theirs = Chat.objects.create(model="scripted:test", owner=grace)
    other = Client()
    other.force_login(grace)
    readers.append(open_events(other, theirs))

    # A stream that ends gives its place back.
    readers.pop(0).close()
    readers.append(open_events(owner, chat))
    for reader in readers:
        reader.close()


def test_a_response_that_does_not_stream_gives_its_place_back(capped, backend, owner, chat):
    resume = reverse("agentloop:usechat-stream", args=[chat.pk])
    for _ in range(CAP + 3):
        assert owner.get(resume).status_code == 204  # no run: nothing to stream

    readers = [open_events(owner, chat) for _ in range(CAP)]

    for reader in readers:
        reader.close()


def test_with_redis_the_slots_live_in_redis_and_expire_on_its_clock(
    capped, redis_events, user, owner, chat
):
    reader = open_events(owner, chat)

    (key,) = redis_events.keys("*streams*")
    assert key.decode().endswith(f":streams:user:{user.pk}")
    ((_token, expires),) = redis_events.zrange(key, 0, -1, withscores=True)
    now = float(redis_events.time()[0])
    assert now < expires <= now + slot_seconds() + 1
    assert 0 < redis_events.ttl(key) <= slot_seconds() + 1

    reader.close()
    assert redis_events.zcard(key) == 0


# -- what open streams cost ------------------------------------------------------------------------
def redis_connections(client: Any) -> int:
    """Connections to the test's Redis database (the suite's other processes use others)."""
    database = client.connection_pool.connection_kwargs.get("db", 0)
    return sum(1 for entry in client.client_list() if int(entry.get("db", -1)) == database)


STREAMS = 16


def idle_async_streams(user, chat, during) -> Any:
    """Open ``STREAMS`` async event streams of ``chat`` (under ASGI: ``AsyncClient``), let each
    read the chat's state, then run ``during()`` (awaited) while they idle; returns its value."""
    client = AsyncClient()
    client.force_login(user)

    async def main() -> Any:
        readers, waits = [], []
        try:
            for _ in range(STREAMS):
                response = await client.get(events_url(chat))
                assert response.status_code == 200
                reader = AsyncReader(response)
                readers.append(reader)
                await asyncio.wait_for(reader.until(is_state), DEADLINE)
            # Each waits for its next frame (a keep-alive, 30 s away): idle.
            waits = [asyncio.ensure_future(reader.next_frame()) for reader in readers]
            return await during()
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            for reader in readers:
                await reader.close()

    return async_to_sync(main)()


def test_async_streams_share_one_redis_connection_per_event_loop(
    settings, redis_events, user, chat
):
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "EVENTS_KEEPALIVE": 30.0,
        "EVENTS_STREAMS_PER_USER": STREAMS,
    }
    before = redis_connections(redis_events)

    async def count() -> int:
        await asyncio.sleep(0.3)  # every stream is reading by now
        return redis_connections(redis_events)

    during = idle_async_streams(user, chat, count)

    # One for the shared reader, one for the process's own client (the slots), at most.
    assert during - before <= 3, (before, during)


def test_idle_streams_of_one_chat_share_their_reads_of_it(settings, redis_events, user, chat):
    interval = 0.1
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "EVENTS_POLL_INTERVAL": interval,
        "EVENTS_KEEPALIVE": 30.0,
        "EVENTS_STREAMS_PER_USER": STREAMS,
    }
    window = 1.5

    async def queries_in_window() -> int:
        # The streams' reads run on this thread's connection (sync_to_async, thread-sensitive).
        start = await sync_to_async(lambda: len(connection.queries))()
        await asyncio.sleep(window)
        return await sync_to_async(lambda: len(connection.queries))() - start

    with CaptureQueriesContext(connection):
        made = idle_async_streams(user, chat, queries_in_window)

    # Unshared, 16 streams polling every 0.1 s would make some 240 reads in 1.5 s; shared,
    # one per half interval whatever the number of streams.
    per_second = made / window
    assert 0 < per_second <= 2 / interval + 5, made


def test_an_erased_chat_among_the_shared_reads_ends_only_its_own_stream(
    settings, redis_events, user, chat, django_user_model
):
    from agentloop import data
    from agentloop.messages import TextDelta

    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_POLL_INTERVAL": 0.05}
    grace = django_user_model.objects.create_user(username="grace", password="pw")
    theirs = Chat.objects.create(model="scripted:test", owner=grace)
    clients = {user: AsyncClient(), grace: AsyncClient()}
    for person, client in clients.items():
        client.force_login(person)

    async def main() -> tuple[list[Any], Any]:
        erased = AsyncReader(await clients[user].get(events_url(chat)))
        kept = AsyncReader(await clients[grace].get(events_url(theirs)))
        for reader in (erased, kept):
            await asyncio.wait_for(reader.until(is_state), DEADLINE)
        # Its stream becomes a tombstone, which fails an XREAD naming it: the shared read
        # goes on without it (the erased stream, not read meanwhile, stays in it).
        await sync_to_async(data.erase_owner)(user, wait=0)
        await asyncio.sleep(0.3)
        await sync_to_async(events.publish_chunk)(theirs, TextDelta(text="still here"))
        frames = await asyncio.wait_for(kept.until(lambda f: f.event == "chunk"), DEADLINE)
        await kept.close()
        rest = []
        with pytest.raises(StopAsyncIteration):  # it ends at its next look at the chat
            while True:
                rest.append(await asyncio.wait_for(erased.next_frame(), DEADLINE))
        return rest, frames[-1]

    rest, chunk = async_to_sync(main)()

    assert rest == []
    assert chunk.data == {"text": "still here"}


def test_the_shared_reader_stops_when_cancelled_even_if_redis_swallows_the_cancel(
    redis_events,
):
    """A cancel that lands as a read's own timeout expires is swallowed by redis-py (the read
    returns nothing); the reader must stop all the same, or a closing event loop waits for
    it for ever. Cancelled at random moments, it stops every time."""
    import random

    from agentloop.process import stream_reader
    from tests.sse_reading import REDIS_URL

    async def main() -> list[float]:
        took = []
        for _ in range(80):
            subscription = stream_reader.subscribe(REDIS_URL, 100)
            reading = asyncio.ensure_future(subscription.read("nothing:here", None, 5))
            await asyncio.sleep(0.01)
            hub = subscription.hub
            await asyncio.sleep(random.random() * stream_reader.BLOCK * 1.5)
            assert hub.task is not None
            hub.task.cancel()
            started = asyncio.get_running_loop().time()
            await asyncio.wait({hub.task}, timeout=2)
            took.append(asyncio.get_running_loop().time() - started)
            reading.cancel()
            await subscription.aclose()
        return took

    took = async_to_sync(main)()

    assert max(took) < 1.0, sorted(took)[-5:]


# -- across processes --------------------------------------------------------------------------
@pytest.mark.subprocess
def test_the_cap_counts_the_streams_another_process_holds(
    tmp_path, capped, redis_events, user, chat
):
    import httpx
    from httpx_sse import connect_sse

    from tests.sse_reading import REDIS_URL

    served = {"REDIS_URL": REDIS_URL, "EVENTS_STREAMS_PER_USER": CAP, "EVENTS_KEEPALIVE": 30.0}
    with uvicorn_serving(tmp_path, served) as url, ExitStack() as stack:
        http = stack.enter_context(httpx.Client(cookies=session_cookie(user), timeout=DEADLINE))
        kept = []  # a reader dropped closes its connection: the server frees its place
        for _ in range(CAP):
            source = stack.enter_context(connect_sse(http, "GET", url + events_url(chat)))
            assert source.response.status_code == 200
            kept.append(source.iter_sse())
            next(event for event in kept[-1] if event.event == "state")
        # The server (another process) refuses a third too, and so does this one.
        assert http.get(url + events_url(chat)).status_code == 429
        here = Client()
        here.force_login(user)
        assert here.get(events_url(chat)).status_code == 429
        events.flush()
