"""An open event stream checks again that its reader may see the chat, and ends when not.

Every ``EVENTS_REAUTH_SECONDS`` (0 here: at every poll) the stream reloads the reader
from its session and asks ``can_view_chat``; a logout (its session deleted), a
deactivated user or a chat given to someone else ends the stream. A reconnect is a new
request, checked like the first. Both drivers: sync (WSGI, the test client) and async
(ASGI, ``AsyncClient``, and a real uvicorn server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.test import AsyncClient, Client

from agentloop.models import Chat
from tests.sse_reading import (
    AsyncReader,
    Frame,
    Reader,
    events_url,
    is_state,
    say,
    session_cookie,
    uvicorn_serving,
)

pytestmark = pytest.mark.django_db

EVERY_POLL = {"EVENTS_POLL_INTERVAL": 0.01, "EVENTS_KEEPALIVE": 30.0, "EVENTS_REAUTH_SECONDS": 0}


@pytest.fixture(autouse=True)
def _check_at_every_poll(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, **EVERY_POLL}


def log_out_everywhere(user) -> None:
    """What ``logout()`` does to the session row of each of the user's logins."""
    for session in Session.objects.all():
        if session.get_decoded().get("_auth_user_id") == str(user.pk):
            session.delete()


def deactivate(user) -> None:
    type(user).objects.filter(pk=user.pk).update(is_active=False)


def give_away(chat, django_user_model) -> None:
    other = django_user_model.objects.create_user(username="olga")
    Chat.objects.filter(pk=chat.pk).update(owner=other)


LOSSES: dict[str, Callable[..., None]] = {
    "logged out": lambda user, chat, users: log_out_everywhere(user),
    "deactivated": lambda user, chat, users: deactivate(user),
    "chat given to another owner": lambda user, chat, users: give_away(chat, users),
}


# -- sync (WSGI) ---------------------------------------------------------------------------
def frames_to_the_end(reader: Reader) -> list[Frame]:
    """Every frame until the stream ends."""
    frames = []
    try:
        while True:
            frames.append(reader.next_frame())
            assert len(frames) < 10_000, "the stream did not end"
    except StopIteration:
        return frames


def open_sync(user, chat) -> tuple[Client, Reader]:
    client = Client()
    client.force_login(user)
    response = client.get(events_url(chat))
    assert response.status_code == 200
    return client, Reader(response)


@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_sync_stream_ends_when_access_is_gone(user, chat, django_user_model, loss):
    _client, reader = open_sync(user, chat)
    reader.until(is_state)

    LOSSES[loss](user, chat, django_user_model)
    say(chat, "assistant", "Not for you any more")
    after_loss = frames_to_the_end(reader)

    assert [f for f in after_loss if f.event == "message"] == []


def test_the_sync_stream_goes_on_while_access_holds(user, chat):
    _client, reader = open_sync(user, chat)
    reader.until(is_state)

    say(chat, "assistant", "Still yours")
    message = reader.until(lambda f: f.event == "message")[-1]
    reader.close()

    assert message.data["content"] == "Still yours"


def test_staff_losing_the_view_permission_lose_the_stream(django_user_model, chat):
    staff = django_user_model.objects.create_user(username="sam", is_staff=True)
    permission = Permission.objects.get(codename="view_chat", content_type__app_label="agentloop")
    staff.user_permissions.add(permission)
    _client, reader = open_sync(staff, chat)
    reader.until(is_state)

    staff.user_permissions.remove(permission)
    say(chat, "assistant", "Staff only, until now")

    assert [f for f in frames_to_the_end(reader) if f.event == "message"] == []


def test_a_reconnect_after_logout_is_sent_to_the_login_page(user, chat, settings):
    client, reader = open_sync(user, chat)
    reader.until(is_state)
    client.logout()
    frames_to_the_end(reader)

    again = client.get(events_url(chat), HTTP_LAST_EVENT_ID="1")

    assert again.status_code == 302
    assert again["Location"].startswith(settings.LOGIN_URL)


def test_a_reconnect_after_the_chat_changed_hands_is_404(user, chat, django_user_model):
    client, reader = open_sync(user, chat)
    reader.until(is_state)
    give_away(chat, django_user_model)
    frames_to_the_end(reader)

    assert client.get(events_url(chat), HTTP_LAST_EVENT_ID="1").status_code == 404


@pytest.mark.timeout(60)
def test_an_idle_stream_ends_when_access_is_gone_without_waiting_for_a_keepalive(
    user, chat, settings, django_user_model
):
    """Nothing new to send: the check still runs when due, not at the next keepalive (an
    hour away here; with that, this test would hang until its timeout)."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_KEEPALIVE": 3600}
    _client, reader = open_sync(user, chat)
    reader.until(is_state)
    give_away(chat, django_user_model)

    assert [f for f in frames_to_the_end(reader) if f.event == "message"] == []


def test_access_is_checked_only_every_reauth_seconds(user, chat, settings, django_user_model):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_REAUTH_SECONDS": 3600}
    _client, reader = open_sync(user, chat)
    reader.until(is_state)

    give_away(chat, django_user_model)  # not noticed before the next check, an hour away
    say(chat, "assistant", "Sent before the next check")
    message = reader.until(lambda f: f.event == "message")[-1]
    reader.close()

    assert message.data["content"] == "Sent before the next check"


# -- async (ASGI) --------------------------------------------------------------------------
def read_async_to_the_end(user, chat, change: Callable[[], None]) -> list[Frame]:
    """Open the async stream, wait for its state, ``change()``, then read until it ends."""
    client = AsyncClient()
    client.force_login(user)

    async def main() -> list[Frame]:
        response = await client.get(events_url(chat))
        assert response.status_code == 200
        assert response.is_async
        reader = AsyncReader(response)
        try:
            await reader.until(is_state)
            await sync_to_async(change)()
            frames = []
            while True:
                try:
                    frames.append(await reader.next_frame())
                except StopAsyncIteration:
                    return frames
                assert len(frames) < 10_000, "the stream did not end"
        finally:
            await reader.close()

    return async_to_sync(main)()


@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_async_stream_ends_when_access_is_gone(user, chat, django_user_model, loss):
    def change() -> None:
        LOSSES[loss](user, chat, django_user_model)
        say(chat, "assistant", "Not for you any more")

    after_loss = read_async_to_the_end(user, chat, change)

    assert [f for f in after_loss if f.event == "message"] == []


def test_the_async_stream_goes_on_while_access_holds(user, chat):
    client = AsyncClient()
    client.force_login(user)

    async def main() -> Any:
        response = await client.get(events_url(chat))
        reader = AsyncReader(response)
        try:
            await reader.until(is_state)
            await sync_to_async(say)(chat, "assistant", "Still yours")
            return (await reader.until(lambda f: f.event == "message"))[-1]
        finally:
            await reader.close()

    assert async_to_sync(main)().data["content"] == "Still yours"


# -- a real ASGI server --------------------------------------------------------------------
@pytest.fixture
def uvicorn_checking_every_poll(tmp_path) -> Iterator[str]:
    """uvicorn serving the test site, its streams checking access at every poll."""
    with uvicorn_serving(tmp_path, EVERY_POLL) as url:
        yield url


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_under_uvicorn_a_logout_elsewhere_ends_the_open_stream(
    uvicorn_checking_every_poll, user, chat
):
    import httpx
    from httpx_sse import connect_sse

    cookies = session_cookie(user)
    url = uvicorn_checking_every_poll + events_url(chat)
    with httpx.Client(cookies=cookies, timeout=30) as http:
        with connect_sse(http, "GET", url) as source:
            events = source.iter_sse()
            assert next(e for e in events if e.event == "state").json()["state"] == "idle"
            Session.objects.filter(session_key=cookies["sessionid"]).delete()  # logged out
            say(chat, "assistant", "Not for you any more")
            after_logout = [e.event for e in events]  # until the server ends the stream
        again = http.get(url)

    assert "message" not in after_logout
    assert again.status_code == 302  # the reconnect is sent to the login page
