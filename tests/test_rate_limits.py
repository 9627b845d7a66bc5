"""Fleet rate limits (docs/rate-limits.md): the buckets' arithmetic, each limiter (this
process's memory, the database's rows on SQLite and PostgreSQL, the machine's Redis under a
key prefix of its own), and how a model call waits: in place (a cancel stops it), past its
deadline, and in the background by ending the step (the job comes back later)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connections
from django.utils import timezone

import agentloop
from agentloop import CancelledError, providers
from agentloop.django_store.database import DjangoStore
from agentloop.engine.rate_limiting import (
    Bucket,
    MemoryRateLimiter,
    RateLimiter,
    Shortfall,
    buckets_for,
    memory_limiter,
    take,
)
from agentloop.models import Chat, ChatState, RateLimitBucket, Usage
from agentloop.rate_limits import DatabaseRateLimiter, RedisRateLimiter
from agentloop.runners import Job, run_step
from agentloop.runners.job import next_job
from agentloop.runners.sweeper import stalled_chats
from tests.budget_helpers import PricedProvider
from tests.helpers import wait_until
from tests.sse_reading import REDIS_URL

pytestmark = pytest.mark.django_db

PER_MINUTE_3 = Bucket("priced/requests", 3.0, 3 / 60, 1.0)


@pytest.fixture
def limits(settings):
    def set_limits(rate_limits, **others):
        settings.AGENTLOOP = {**settings.AGENTLOOP, "RATE_LIMITS": rate_limits, **others}

    return set_limits


@pytest.fixture
def redis_prefix(settings):
    """The machine's Redis, under a key prefix of this test's own (deleted afterwards)."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis does not answer at {REDIS_URL}: {exc}")
    prefix = f"agentloop-test-ratelimits-{uuid.uuid4().hex[:8]}"
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_URL": REDIS_URL, "REDIS_PREFIX": prefix}
    yield client, prefix
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


# -- the buckets ------------------------------------------------------------------------------
def test_a_bucket_refills_to_a_minutes_worth_and_says_how_long_until_it_has_room():
    assert take(3.0, 0.0, PER_MINUTE_3) == (2.0, 0.0)
    level, wait = take(0.0, 10.0, PER_MINUTE_3)  # 10 s refill half a request: no room yet
    assert level == 0.5 and wait == pytest.approx(10.0)
    assert take(2.0, 3600.0, PER_MINUTE_3) == (2.0, 0.0)  # never more than a minute's worth


def test_a_call_bigger_than_a_whole_bucket_goes_when_it_is_full_and_leaves_it_in_debt():
    tokens = Bucket("priced/tokens", 1000.0, 1000 / 60, 2500.0)

    assert take(1000.0, 0.0, tokens) == (-1500.0, 0.0)
    level, wait = take(-1500.0, 0.0, tokens)
    assert level == -1500.0 and wait == pytest.approx(150.0)  # back to full: 2500 / (1000/60)


def test_a_call_takes_from_its_models_and_its_providers_buckets(limits):
    limits({"priced": {"requests_per_minute": 60, "tokens_per_minute": 6000},
            "priced:big": {"requests_per_minute": 6}})  # fmt: skip

    found = buckets_for("priced", "big", 120)

    assert [(b.key, b.capacity, b.cost) for b in found] == [
        ("priced/requests", 60.0, 1.0),
        ("priced/tokens", 6000.0, 120.0),
        ("priced:big/requests", 6.0, 1.0),
    ]
    assert found[0].label == "priced requests per minute"
    assert buckets_for("other", "big", 120) == []


# -- the limiters -----------------------------------------------------------------------------
@pytest.fixture(params=["memory", "database", "redis"])
def limiter(request) -> RateLimiter:
    if request.param == "memory":
        return MemoryRateLimiter()
    if request.param == "database":
        return DatabaseRateLimiter()
    request.getfixturevalue("redis_prefix")
    return RedisRateLimiter()


def _forget(limiter: RateLimiter, key: str) -> None:
    """Empty a bucket's state: it reads as full again."""
    if isinstance(limiter, MemoryRateLimiter):
        limiter._levels.pop(key, None)
    elif isinstance(limiter, DatabaseRateLimiter):
        RateLimitBucket.objects.filter(key=key).delete()
    else:
        from agentloop.process.redis_client import client, prefix

        client().delete(f"{prefix()}:ratelimit:{key}")


def test_a_limiter_takes_until_a_bucket_is_empty_then_says_how_long_to_wait(limiter):
    assert [limiter.take([PER_MINUTE_3]) for _ in range(3)] == [None, None, None]

    short = limiter.take([PER_MINUTE_3])

    assert isinstance(short, Shortfall) and short.bucket == PER_MINUTE_3
    assert short.seconds == pytest.approx(20.0, abs=1.0)  # one request refills in 20 s


def test_a_limiter_takes_from_every_bucket_of_a_call_or_from_none(limiter):
    provider = Bucket("priced/requests", 2.0, 2 / 60, 1.0)
    model = Bucket("priced:small/requests", 3.0, 3 / 60, 1.0)
    assert limiter.take([provider]) is None and limiter.take([provider]) is None  # emptied

    refused = [limiter.take([provider, model]) for _ in range(3)]

    assert [short.bucket.key for short in refused if short] == ["priced/requests"] * 3
    _forget(limiter, "priced/requests")
    # The model's bucket gave nothing to the refused calls: all three of its requests are left.
    assert [limiter.take([model]) for _ in range(3)] == [None, None, None]
    assert limiter.take([model]) is not None


def test_the_database_buckets_are_rows_on_the_databases_clock():
    DatabaseRateLimiter().take([PER_MINUTE_3])

    row = RateLimitBucket.objects.get(key="priced/requests")
    assert row.level == pytest.approx(2.0, abs=0.01)
    assert abs(row.stamp - time.time()) < 60  # seconds since the epoch


def test_redis_buckets_live_under_the_prefix_and_expire_once_full_again(redis_prefix):
    client, prefix = redis_prefix
    RedisRateLimiter().take([PER_MINUTE_3])

    key = f"{prefix}:ratelimit:priced/requests"
    assert float(client.hget(key, "level")) == pytest.approx(2.0, abs=0.01)
    assert 0 < client.ttl(key) <= 21  # one request refills in 20 s


def test_without_its_redis_a_limiter_lets_calls_go_and_warns(settings, caplog):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_URL": "redis://127.0.0.1:1/0"}

    assert RedisRateLimiter().take([PER_MINUTE_3]) is None
    assert "calls go unpaced" in caplog.text


# -- model calls waiting ------------------------------------------------------------------------
class Recording(RateLimiter):
    """The database limiter, with what it answered."""

    def __init__(self) -> None:
        self.inner = DatabaseRateLimiter()
        self.answers: list[Shortfall | None] = []

    def take(self, buckets: list[Bucket]) -> Shortfall | None:
        answer = self.inner.take(buckets)
        self.answers.append(answer)
        return answer


def drain(key: str, seconds: float, per_minute: int) -> None:
    """Leave the database bucket ``key`` ``seconds`` short of a request."""
    level = 1 - seconds * per_minute / 60
    RateLimitBucket.objects.update_or_create(
        key=key, defaults={"level": level, "stamp": _database_now()}
    )


def _database_now() -> float:
    if connections["default"].vendor != "postgresql":
        return time.time()
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::double precision")
        return float(cursor.fetchone()[0])


def test_a_call_waits_in_place_for_its_rate_limit_then_goes(priced, limits, user, monkeypatch):
    limits({"priced": {"requests_per_minute": 600}})
    recording = Recording()
    monkeypatch.setattr(DjangoStore, "rate_limiter", lambda store: recording)
    priced.add("ok")
    chat = Chat.objects.create(model="priced:test", owner=user)
    # Short of a request by 0.8 s: under SHOWN_AFTER (1 s), and still short when the ask takes
    # from it on a loaded machine (0.2 s was not, once: the bucket had refilled by then).
    drain("priced/requests", 0.8, 600)

    assert chat.ask("Hi").content == "ok"

    assert isinstance(recording.answers[0], Shortfall) and recording.answers[-1] is None
    chat.refresh_from_db()
    assert chat.waiting_for == ""  # a short wait is not written on the chat


@pytest.mark.django_db(transaction=True)
def test_a_long_wait_shows_on_the_chat_and_a_cancel_stops_it(priced, limits, user):
    limits({"priced": {"requests_per_minute": 1}})
    drain("priced/requests", 600, 1)
    chat = Chat.objects.create(model="priced:test", owner=user)
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            Chat.objects.get(pk=chat.pk).ask("Hi")
        except BaseException as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        wait_until(
            lambda: (
                Chat.objects.get(pk=chat.pk).waiting_for == "rate limit: priced requests per minute"
            ),
            "the wait to show on the chat",
        )
        assert Chat.objects.get(pk=chat.pk).cancel()
    finally:
        thread.join(30)

    assert [type(error) for error in outcome] == [CancelledError]
    chat.refresh_from_db()
    assert (chat.state, chat.waiting_for, chat.lease_token) == (ChatState.IDLE, "", "")
    assert priced.requests == [] and not Usage.objects.exists()


def test_a_wait_past_the_calls_deadline_fails_the_call(priced, limits, user):
    limits({"priced": {"requests_per_minute": 1}}, MODEL_CALL_TIMEOUT=0.5)
    drain("priced/requests", 600, 1)
    chat = Chat.objects.create(model="priced:test", owner=user)

    with pytest.raises(Exception, match="waited for the rate limit: priced requests per minute"):
        chat.ask("Hi")
    assert priced.requests == []


def test_a_background_step_that_must_wait_long_ends_and_its_job_comes_back_later(
    priced, limits, user, admin_client
):
    limits({"priced": {"requests_per_minute": 60}}, RATE_LIMIT_WAIT=0.5)
    drain("priced/requests", 30, 60)
    chat = Chat.objects.create(model="priced:test", owner=user).ask_later("Hi")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    outcome = run_step(chat.pk)  # what a worker's job runs

    assert outcome.action == "retry" and outcome.retry_in == pytest.approx(30, abs=5)
    assert next_job(Job(chat.pk), outcome).countdown == outcome.retry_in
    chat.refresh_from_db()
    assert (chat.state, chat.waiting_for, chat.attempts, chat.error) == (
        ChatState.QUEUED, "rate limit: priced requests per minute", 0, "",
    )  # fmt: skip
    assert chat.retry_at > timezone.now() and chat.lease_token == ""
    assert priced.requests == []
    assert not stalled_chats().filter(pk=chat.pk).exists()  # the sweeper leaves it be
    listed = admin_client.get("/admin/agentloop/chat/?waiting_for=rate_limit").content.decode()
    assert "rate limit: priced requests per minute" in listed

    drain("priced/requests", 0, 60)  # the limit has room again
    priced.add("ok")
    assert run_step(chat.pk).action == "done"
    chat.refresh_from_db()
    assert (chat.state, chat.waiting_for) == (ChatState.IDLE, "")


def test_the_in_memory_chat_takes_from_its_processs_buckets(limits):
    limits({"priced": {"requests_per_minute": 600}})
    model = PricedProvider("ok")
    providers.register("priced", model)
    memory_limiter()._levels.pop("priced/requests", None)
    try:
        assert agentloop.chat("priced:test").ask("Hi").content == "ok"
    finally:
        providers.unregister("priced")

    level, _ = memory_limiter()._levels["priced/requests"]
    assert level == pytest.approx(599, abs=0.5)
