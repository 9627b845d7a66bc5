"""The cancel view and the admin's cancel and resume actions (docs/design.md §4, §9).

POST only, CSRF on, login required; the owner or staff with the change permission; anyone
else gets 404. 204 for ``fetch``/XHR callers, a redirect back for an HTML form.
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

from agentloop import providers
from agentloop.models import Chat, ChatState
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import FunctionProvider, stream
from tests.clients import logged_in

pytestmark = pytest.mark.django_db

CSRF_TOKEN = "a" * 32  # any well-formed secret: the cookie and the header must match


@pytest.fixture
def chat(user):
    """A chat with a run on its way (queued): there is something to cancel."""
    return Chat.objects.create(model="scripted:test", owner=user, state="queued")


def cancel_url(chat) -> str:
    return reverse("agentloop:cancel", args=[chat.pk])


def cancel_requested(chat) -> bool:
    chat.refresh_from_db()
    return chat.cancel_requested_at is not None


# -- the cancel view ---------------------------------------------------------------------------
def test_the_owner_cancelling_with_fetch_gets_204_and_the_flag_is_set(owner, chat):
    response = owner.post(cancel_url(chat), HTTP_ACCEPT="*/*")

    assert response.status_code == 204
    assert response.content == b""
    assert cancel_requested(chat)


def test_a_form_post_is_redirected_to_next(owner, chat):
    response = owner.post(cancel_url(chat), {"next": "/chats/7/"}, HTTP_ACCEPT="text/html")

    assert response.status_code == 302
    assert response["Location"] == "/chats/7/"
    assert cancel_requested(chat)


def test_a_form_post_without_next_goes_back_to_the_referer(owner, chat):
    response = owner.post(
        cancel_url(chat), HTTP_ACCEPT="text/html", HTTP_REFERER="http://testserver/chats/7/"
    )

    assert response["Location"] == "http://testserver/chats/7/"


def test_a_form_post_never_redirects_to_another_site(owner, chat):
    response = owner.post(
        cancel_url(chat), {"next": "https://evil.example/"}, HTTP_ACCEPT="text/html"
    )

    assert response["Location"] == "/"
    assert cancel_requested(chat)


def test_get_is_not_allowed(owner, chat):
    response = owner.get(cancel_url(chat))

    assert response.status_code == 405
    assert not cancel_requested(chat)


def test_a_post_without_the_csrf_token_is_refused(user, chat):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post(cancel_url(chat), HTTP_ACCEPT="*/*")

    assert response.status_code == 403
    assert not cancel_requested(chat)


def test_a_post_with_the_csrf_token_is_accepted(user, chat):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies[settings.CSRF_COOKIE_NAME] = CSRF_TOKEN

    response = client.post(cancel_url(chat), HTTP_ACCEPT="*/*", HTTP_X_CSRFTOKEN=CSRF_TOKEN)

    assert response.status_code == 204
    assert cancel_requested(chat)


def test_anonymous_users_are_sent_to_log_in(client, chat):
    response = client.post(cancel_url(chat))

    assert response.status_code == 302
    assert response["Location"].startswith(settings.LOGIN_URL + "?next=")
    assert not cancel_requested(chat)


def test_another_user_gets_404(django_user_model, chat):
    stranger = logged_in(django_user_model, "eve")

    response = stranger.post(cancel_url(chat))

    assert response.status_code == 404
    assert not cancel_requested(chat)


def test_staff_without_the_change_permission_get_404(django_user_model, chat):
    staff = logged_in(django_user_model, "sam", staff=True, perms=["view_chat"])

    response = staff.post(cancel_url(chat))

    assert response.status_code == 404
    assert not cancel_requested(chat)


def test_cancelling_a_chat_with_no_run_answers_409_and_sets_nothing(owner, user):
    idle = Chat.objects.create(model="scripted:test", owner=user)

    response = owner.post(cancel_url(idle), HTTP_ACCEPT="*/*")

    assert response.status_code == 409
    assert "nothing to cancel" in response.content.decode()
    assert not cancel_requested(idle)


def test_staff_with_the_change_permission_may_cancel(django_user_model, chat):
    staff = logged_in(django_user_model, "sam", staff=True, perms=["change_chat"])

    response = staff.post(cancel_url(chat), HTTP_ACCEPT="*/*")

    assert response.status_code == 204
    assert cancel_requested(chat)


def test_an_unknown_chat_is_404(owner):
    response = owner.post(reverse("agentloop:cancel", args=[987654]))

    assert response.status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_cancel_view_stops_a_chat_streaming_in_the_background(owner, chat):
    started = threading.Event()

    def answer(request):
        started.set()
        return stream(*[f"w{i} " for i in range(500)], delay=0.01)

    providers.register("slowstream", FunctionProvider(answer))
    agentloop = {**settings.AGENTLOOP, "BACKGROUND": "embedded"}
    try:
        with override_settings(AGENTLOOP=agentloop):
            chat.with_model("slowstream:test").ask_later("A long story, please")
            chat.complete_later()
            assert started.wait(30)

            response = owner.post(cancel_url(chat), HTTP_ACCEPT="*/*")
            assert wait_for_embedded_jobs(30)
    finally:
        providers.unregister("slowstream")

    assert response.status_code == 204
    chat.refresh_from_db()
    assert (chat.state, chat.cancel_requested_at) == (ChatState.IDLE, None)
    assert chat.messages.get(role="assistant").status == "cancelled"


# -- admin actions -----------------------------------------------------------------------------
def changelist() -> str:
    return reverse("admin:agentloop_chat_changelist")


def run_action(client, action, *chats):
    return client.post(
        changelist(), {"action": action, "_selected_action": [c.pk for c in chats]}, follow=True
    )


def test_the_admin_cancel_action_requests_cancellation_of_the_selected_chats(
    admin_client, chat, user
):
    other = Chat.objects.create(model="scripted:test", owner=user, state="running")
    idle = Chat.objects.create(model="scripted:test", owner=user)
    untouched = Chat.objects.create(model="scripted:test", owner=user, state="queued")

    response = run_action(admin_client, "cancel_chats", chat, other, idle)

    assert response.status_code == 200
    page = response.content.decode()
    assert "Cancellation requested for 2 chat(s)." in page
    assert "1 chat(s) had no run to cancel." in page
    assert cancel_requested(chat) and cancel_requested(other)
    assert not cancel_requested(untouched) and not cancel_requested(idle)


def test_staff_who_may_only_view_chats_cannot_cancel_them(django_user_model, chat):
    viewer = logged_in(django_user_model, "vic", staff=True, perms=["view_chat"])

    response = run_action(viewer, "cancel_chats", chat)

    assert response.status_code == 200
    assert not cancel_requested(chat)


@pytest.mark.django_db(transaction=True)
def test_the_admin_resume_action_runs_the_selected_chats_in_the_background(
    admin_client, chat, scripted
):
    scripted.add("Back on track.")
    chat.ask_later("Where were we?")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.FAILED, error="boom")

    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "BACKGROUND": "embedded"}):
        response = run_action(admin_client, "resume_chats", chat)
        assert wait_for_embedded_jobs(30)

    assert "1 chat(s) queued." in response.content.decode()
    chat.refresh_from_db()
    assert (chat.state, chat.error) == (ChatState.IDLE, "")
    assert chat.messages.order_by("id").last().content == "Back on track."
