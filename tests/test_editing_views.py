"""The edit and regenerate views (docs/editing.md) and the admin's view of edited chats.

POST only, CSRF on, login required; the owner or staff with the change permission; anyone
else gets 404. The replacement is answered in the background (complete_later): here the
test's transaction never commits, so the chat is left queued, except where the embedded
runner answers it for real.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

from agentloop.models import Chat, ChatState
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from tests.clients import logged_in
from tests.tools import transfer

pytestmark = pytest.mark.django_db

CSRF_TOKEN = "b" * 32


@pytest.fixture
def answered(chat, scripted):
    """A chat with one question answered."""
    scripted.add("Hello <b>there</b>.")
    chat.ask("Hi <script>alert(1)</script>")
    return chat


def regenerate_url(chat) -> str:
    return reverse("agentloop:regenerate", args=[chat.pk])


def edit_url(chat, message) -> str:
    return reverse("agentloop:edit", args=[chat.pk, message.pk])


def first_user(chat):
    return chat.messages.current().filter(role="user").order_by("id").first()


def superseded(chat) -> int:
    return chat.messages.superseded().count()


# -- what the views do ---------------------------------------------------------------------------
def test_regenerate_supersedes_the_last_turn_and_queues_the_new_answer(owner, answered):
    response = owner.post(regenerate_url(answered), HTTP_ACCEPT="*/*")

    assert response.status_code == 204
    answered.refresh_from_db()
    assert answered.state == ChatState.QUEUED
    assert superseded(answered) == 2
    assert [(m.role, m.content) for m in answered.messages.current()] == [
        ("user", "Hi <script>alert(1)</script>")
    ]


def test_edit_replaces_the_message_with_the_posted_text(owner, answered):
    response = owner.post(
        edit_url(answered, first_user(answered)), {"text": "  Hi again  "}, HTTP_ACCEPT="*/*"
    )

    assert response.status_code == 204
    assert [(m.role, m.content) for m in answered.messages.current()] == [("user", "Hi again")]
    assert Chat.objects.get(pk=answered.pk).state == ChatState.QUEUED


def test_a_form_post_goes_back_to_the_page(owner, answered):
    response = owner.post(
        regenerate_url(answered), {"next": f"/chats/{answered.pk}/"}, HTTP_ACCEPT="text/html"
    )

    assert (response.status_code, response["Location"]) == (302, f"/chats/{answered.pk}/")


@pytest.mark.django_db(transaction=True)
def test_the_new_answer_comes_from_the_background(owner, answered, scripted):
    scripted.add("Hello again.")
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "BACKGROUND": "embedded"}):
        response = owner.post(regenerate_url(answered), HTTP_ACCEPT="*/*")
        assert wait_for_embedded_jobs(30)

    assert response.status_code == 204
    answered.refresh_from_db()
    assert answered.state == ChatState.IDLE
    assert [m.content for m in answered.messages.current()][-1] == "Hello again."


# -- refusals: nothing is written --------------------------------------------------------------
def test_an_edit_without_text_is_400(owner, answered):
    response = owner.post(edit_url(answered, first_user(answered)), {"text": "   "})

    assert response.status_code == 400
    assert superseded(answered) == 0


def test_editing_an_answer_is_409_and_says_why(owner, answered):
    answer = answered.messages.get(role="assistant")

    response = owner.post(edit_url(answered, answer), {"text": "Changed"})

    assert response.status_code == 409
    assert b"only a user message can be edited" in response.content
    assert response["Content-Type"].startswith("text/plain")
    assert superseded(answered) == 0


def test_editing_a_superseded_message_is_409(owner, answered, scripted):
    old = first_user(answered)
    scripted.add("Hello!")
    answered.regenerate()

    response = owner.post(edit_url(answered, old), {"text": "Changed"})

    assert response.status_code == 409
    assert b"was superseded" in response.content


def test_a_chat_answering_in_the_background_is_409(owner, answered):
    Chat.objects.filter(pk=answered.pk).update(state=ChatState.RUNNING)

    response = owner.post(regenerate_url(answered))

    assert response.status_code == 409
    assert b"cancel its run" in response.content
    assert superseded(answered) == 0
    assert Chat.objects.get(pk=answered.pk).state == ChatState.RUNNING


def test_regenerating_a_chat_with_no_message_is_409(owner, chat):
    response = owner.post(regenerate_url(chat))

    assert response.status_code == 409
    assert b"no user message" in response.content


def test_a_message_of_another_chat_is_404(owner, answered, user, scripted):
    other = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add("Yes.")
    other.ask("Other?")

    response = owner.post(edit_url(answered, first_user(other)), {"text": "Changed"})

    assert response.status_code == 404
    assert superseded(other) == 0


# -- who may, and how --------------------------------------------------------------------------
@pytest.mark.parametrize("view", ["regenerate", "edit"])
def test_get_is_405(owner, answered, view):
    url = (
        regenerate_url(answered)
        if view == "regenerate"
        else edit_url(answered, first_user(answered))
    )

    assert owner.get(url).status_code == 405
    assert superseded(answered) == 0


@pytest.mark.parametrize("view", ["regenerate", "edit"])
def test_a_post_without_the_csrf_token_is_refused(user, answered, view):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    url = (
        regenerate_url(answered)
        if view == "regenerate"
        else edit_url(answered, first_user(answered))
    )

    assert client.post(url, {"text": "x"}).status_code == 403
    client.cookies[settings.CSRF_COOKIE_NAME] = CSRF_TOKEN
    accepted = client.post(url, {"text": "x"}, HTTP_ACCEPT="*/*", HTTP_X_CSRFTOKEN=CSRF_TOKEN)
    assert accepted.status_code == 204


@pytest.mark.parametrize("view", ["regenerate", "edit"])
@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("stranger", 404),
        ("staff without permission", 404),
        ("staff who may only view", 404),
        ("staff who may change chats", 204),
    ],
)
def test_only_the_owner_or_staff_allowed_to_change_chats_may(
    django_user_model, answered, view, who, status
):
    perms = {
        "staff who may only view": ["view_chat"],
        "staff who may change chats": ["change_chat"],
    }
    client = logged_in(
        django_user_model, who.replace(" ", "-"), staff=who != "stranger", perms=perms.get(who, ())
    )
    url = (
        regenerate_url(answered)
        if view == "regenerate"
        else edit_url(answered, first_user(answered))
    )

    response = client.post(url, {"text": "Changed"}, HTTP_ACCEPT="*/*")

    assert response.status_code == status
    assert superseded(answered) == (0 if status == 404 else 2)


def test_anonymous_users_are_sent_to_log_in(client, answered):
    response = client.post(regenerate_url(answered))

    assert response.status_code == 302
    assert response["Location"].startswith(settings.LOGIN_URL + "?next=")


# -- the admin: superseded rows folded away, forks linked ----------------------------------------
def test_the_admin_folds_superseded_rows_away_and_escapes_them(admin_client, answered, scripted):
    scripted.add("Second <i>answer</i>.")
    answered.regenerate()

    content = admin_client.get(
        reverse("admin:agentloop_chat_change", args=[answered.pk])
    ).content.decode()

    folded = content.split('class="agentloop-entry agentloop-superseded"', 1)[1].split(
        "</details>"
    )[0]
    assert "2 superseded messages" in folded
    assert "Hello &lt;b&gt;there&lt;/b&gt;." in folded  # the old answer, escaped, kept
    assert "Second &lt;i&gt;answer&lt;/i&gt;." not in folded
    assert "Second &lt;i&gt;answer&lt;/i&gt;." in content
    assert "<script>alert(1)</script>" not in content
    assert "(2 superseded)" in content


def test_the_admin_links_a_fork_and_its_origin(admin_client, answered):
    fork = answered.fork()
    at = answered.messages.get(role="assistant")

    fork_page = admin_client.get(reverse("admin:agentloop_chat_change", args=[fork.pk]))
    origin_page = admin_client.get(reverse("admin:agentloop_chat_change", args=[answered.pk]))
    listed = admin_client.get(
        reverse("admin:agentloop_chat_changelist") + f"?forked_from__id__exact={answered.pk}"
    )

    origin_url = reverse("admin:agentloop_chat_change", args=[answered.pk])
    assert f'href="{origin_url}#message-{at.pk}"' in fork_page.content.decode()
    assert f"?forked_from__id__exact={answered.pk}" in origin_page.content.decode()
    assert "1 fork" in origin_page.content.decode()
    assert list(listed.context["cl"].result_list) == [fork]


def test_a_waiting_call_superseded_has_no_decision_buttons(admin_client, chat, scripted):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"), "Not paying.")
    chat.ask("Pay Bob")
    chat.regenerate()

    content = admin_client.get(reverse("admin:agentloop_chat_change", args=[chat.pk])).content

    assert b'name="decision"' not in content
    assert b"superseded by an edit or a regenerated answer: never run" in content
