"""agentloop's Redis keys: a prefix per site; streams capped, expiring, deleted with their chat.

Against the real Redis the SSE tests use (the ``redis_events`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import pytest
from django.db import connections

from agentloop import live_events as events
from agentloop.messages import TextDelta
from agentloop.models import Chat
from agentloop.process import redis_client as _redis
from agentloop.process.cancel_notices import RedisCancelListener, listen_locally
from tests.sse_reading import Reader, events_url, is_state

pytestmark = pytest.mark.django_db


def stream_of(chat) -> str:
    return events.get_backend().stream(events.chat_key(chat))


def test_keys_are_under_the_default_databases_name_by_default(redis_events, chat):
    database = connections["default"].settings_dict["NAME"]

    assert stream_of(chat) == f"agentloop:{database}:events:agentloop.chat:{chat.pk}"
    assert RedisCancelListener(chat, listen_locally(chat)).channel == (
        f"agentloop:{database}:cancel:agentloop.chat:{chat.pk}"
    )


def test_two_sites_on_one_redis_do_not_read_each_others_events(redis_events, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_PREFIX": "site-a"}
    events.publish_chunk(chat, TextDelta(text="for site a"))
    assert events.flush()  # published from a queue: wait until it is sent
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_PREFIX": "site-b"}

    seen_by_b = events.get_backend().read(events.chat_key(chat), after=None, timeout=0.01)

    assert seen_by_b == []
    assert redis_events.exists(f"site-a:events:agentloop.chat:{chat.pk}") == 1


def test_a_stream_expires_after_events_ttl_refreshed_by_each_event(redis_events, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_TTL": 600}
    events.publish_chunk(chat, TextDelta(text="one"))
    assert events.flush()
    redis_events.expire(stream_of(chat), 5)  # as if most of its life had passed

    events.publish_chunk(chat, TextDelta(text="two"))
    assert events.flush()

    assert 5 < redis_events.ttl(stream_of(chat)) <= 600


def test_events_ttl_none_keeps_the_stream_until_its_chat_is_deleted(redis_events, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_TTL": None}
    events.publish_chunk(chat, TextDelta(text="kept"))
    assert events.flush()

    assert redis_events.ttl(stream_of(chat)) == -1  # exists, no expiry


def test_a_stream_is_capped_near_events_maxlen(redis_events, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_MAXLEN": 10}
    for number in range(500):
        events.publish_chunk(chat, TextDelta(text=str(number)))
    assert events.flush()

    # Trimming is approximate (whole radix-tree nodes of up to 100 entries): near, not exact.
    assert redis_events.xlen(stream_of(chat)) <= 110


def test_deleting_a_chat_deletes_its_stream(redis_events, chat):
    chat.ask_later("Hi")
    assert events.flush()
    stream = stream_of(chat)
    assert redis_events.exists(stream) == 1

    chat.delete()

    assert redis_events.exists(stream) == 0


def test_a_queryset_delete_deletes_the_streams_of_every_chat(redis_events, user):
    chats = [Chat.objects.create(model="scripted:test", owner=user) for _ in range(3)]
    for chat in chats:
        events.publish_chunk(chat, TextDelta(text="x"))
    streams = [stream_of(chat) for chat in chats]

    Chat.objects.filter(pk__in=[chat.pk for chat in chats]).delete()

    assert redis_events.exists(*streams) == 0


def test_a_new_chat_with_a_deleted_chats_pk_does_not_see_its_events(
    redis_events, chat, user, django_user_model, client
):
    pk = chat.pk
    chat.ask_later("the old owner's secret")
    events.publish_chunk(chat, TextDelta(text="more of it"))
    chat.delete()
    newcomer = django_user_model.objects.create_user(username="nina")
    Chat.objects.create(pk=pk, model="scripted:test", owner=newcomer)
    client.force_login(newcomer)

    response = client.get(events_url(Chat.objects.get(pk=pk)))
    reader = Reader(response)
    frames = reader.until(is_state)
    reader.close()

    assert [f.event for f in frames if f.event in ("message", "chunk")] == []


def test_an_unreachable_redis_does_not_stop_a_chat_being_deleted(chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_URL": "redis://127.0.0.1:1/0"}

    chat.delete()

    assert not Chat.objects.filter(pk=chat.pk).exists()


def test_one_client_is_shared_per_url(redis_events):
    assert _redis.client() is _redis.client()
