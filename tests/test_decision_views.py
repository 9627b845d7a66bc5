"""The approve, deny and answer views: POST only, CSRF on, the owner or staff with the
change permission; anyone else gets 404 and the anonymous a login redirect."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from agentloop.engine._tool_rounds import DENIED_RESULT
from agentloop.messages import ToolCallState
from agentloop.models import Chat, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from agentloop.tools import AskPerson
from tests.clients import logged_in
from tests.tools import ask_manager, transfer

pytestmark = pytest.mark.django_db

VIEWS = ["approve", "deny", "answer"]


@pytest.fixture
def chat(user, scripted):
    """A chat holding two calls: "t1" waits for approval, "q1" for an answer."""
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer, AskPerson)
    scripted.add(
        [
            tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"),
            tool_call("ask_person", {"question": "Which account?"}, id="q1"),
        ]
    )
    chat.ask("Pay Bob")
    return chat


def call(call_id: str) -> ToolCall:
    return ToolCall.objects.get(call_id=call_id)


def url(view: str, chat: Chat, call_id: str | None = None) -> str:
    """The view's URL for the call it decides ("t1" for approve/deny, "q1" for answer)."""
    call_id = call_id or ("q1" if view == "answer" else "t1")
    return reverse(f"agentloop:{view}", args=[chat.pk, call(call_id).pk])


def data(view: str) -> dict[str, str]:
    return {"text": "Savings"} if view == "answer" else {}


def decided(view: str) -> bool:
    call_id = "q1" if view == "answer" else "t1"
    return call(call_id).decision != ""


# -- what each view does -------------------------------------------------------------------------
def test_approve_view_approves_the_call_for_the_person_posting(owner, chat, user):
    response = owner.post(url("approve", chat))

    assert response.status_code == 204
    decision = call("t1")
    assert (decision.decision, decision.decided_by, decision.state) == ("approved", user, "pending")


def test_deny_view_denies_the_call_with_the_reason_given(owner, chat, user):
    response = owner.post(url("deny", chat), {"reason": "Bob was paid"})

    assert response.status_code == 204
    decision = call("t1")
    assert (decision.decision, decision.decided_by) == ("denied", user)
    assert decision.result.content == DENIED_RESULT + " Reason: Bob was paid"
    assert decision.result.is_error


def test_answer_view_answers_the_question_with_the_text(owner, chat, user):
    response = owner.post(url("answer", chat), {"text": "Savings"})

    assert response.status_code == 204
    answered = call("q1")
    assert (answered.decision, answered.decided_by) == ("answered", user)
    assert answered.result.content == "Savings"


def test_answer_view_answers_a_tool_that_raised_needs_input(client, user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(ask_manager)
    scripted.add(tool_call("ask_manager", {"question": "May I spend 50?"}, id="m1"), "Buying.")
    chat.ask("Buy it")
    client.force_login(user)

    response = client.post(url("answer", chat, "m1"), {"text": "Yes"})
    answer = chat.complete()

    assert response.status_code == 204
    assert call("m1").result.content == "Yes"
    assert answer.content == "Buying."


def test_answer_view_refuses_an_empty_answer(owner, chat):
    response = owner.post(url("answer", chat), {"text": "  "})

    assert response.status_code == 400
    assert call("q1").state == ToolCallState.WAITING


def test_the_chat_goes_on_with_what_the_views_decided(owner, chat, scripted):
    scripted.add("Paid Bob 5 from savings.")
    owner.post(url("approve", chat))
    owner.post(url("answer", chat), {"text": "Savings"})

    answer = Chat.objects.get(pk=chat.pk).complete()

    assert answer.content == "Paid Bob 5 from savings."
    sent = {m.tool_call_id: m.content for m in scripted.requests[-1].messages if m.role == "tool"}
    assert sent == {"t1": "sent 5 to bob", "q1": "Savings"}


@pytest.mark.django_db(transaction=True)
@override_settings(AGENTLOOP={"BACKGROUND": "embedded", "CANCEL_POLL_INTERVAL": 0.05})
def test_a_question_answered_from_the_view_resumes_a_background_chat(client, user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(AskPerson)
    scripted.add(tool_call("ask_person", {"question": "Which account?"}, id="q1"))
    chat.ask_later("Pay the bill").complete_later()
    assert wait_for_embedded_jobs(timeout=30)
    assert Chat.objects.get(pk=chat.pk).state == "waiting"
    scripted.add("Paid from savings.")
    client.force_login(user)

    response = client.post(url("answer", chat), {"text": "Savings"})
    assert wait_for_embedded_jobs(timeout=30)

    assert response.status_code == 204
    chat.refresh_from_db()
    assert (chat.state, chat.messages.last().content) == ("idle", "Paid from savings.")


# -- calls that don't wait for that decision: 409 -------------------------------------------------
@pytest.mark.parametrize(
    ("view", "call_id"),
    [("approve", "q1"), ("deny", "q1"), ("answer", "t1")],
    ids=["approve-a-question", "deny-a-question", "answer-an-approval"],
)
def test_a_decision_the_call_does_not_wait_for_is_409(owner, chat, view, call_id):
    response = owner.post(url(view, chat, call_id), data(view))

    assert response.status_code == 409
    assert call(call_id).decision == ""


def test_approving_twice_is_409(owner, chat):
    owner.post(url("approve", chat))

    response = owner.post(url("approve", chat))

    assert response.status_code == 409
    assert b"already approved" in response.content


@pytest.mark.parametrize("view", VIEWS)
def test_a_call_of_another_of_the_owners_chats_is_409_and_left_alone(owner, chat, user, view):
    other = Chat.objects.create(model="scripted:test", owner=user)
    call_pk = call("q1" if view == "answer" else "t1").pk

    response = owner.post(reverse(f"agentloop:{view}", args=[other.pk, call_pk]), data(view))

    assert response.status_code == 409
    assert not decided(view)


# -- who may decide ----------------------------------------------------------------------------
@pytest.mark.parametrize("view", VIEWS)
def test_the_owner_may_decide(owner, chat, view):
    response = owner.post(url(view, chat), data(view))

    assert response.status_code == 204
    assert decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_another_user_gets_404_and_nothing_changes(django_user_model, chat, view):
    client = logged_in(django_user_model, "eve")

    response = client.post(url(view, chat), data(view))

    assert response.status_code == 404
    assert not decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_staff_without_the_change_permission_get_404(django_user_model, chat, view):
    client = logged_in(django_user_model, "staff", staff=True)

    response = client.post(url(view, chat), data(view))

    assert response.status_code == 404
    assert not decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_a_user_with_the_permission_who_is_not_staff_gets_404(django_user_model, chat, view):
    client = logged_in(django_user_model, "clerk", perms=["change_chat"])

    response = client.post(url(view, chat), data(view))

    assert response.status_code == 404
    assert not decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_staff_with_the_change_permission_may_decide_as_themselves(django_user_model, chat, view):
    client = logged_in(django_user_model, "admin", staff=True, perms=["change_chat"])
    person = django_user_model.objects.get(username="admin")

    response = client.post(url(view, chat), data(view))

    assert response.status_code == 204
    assert call("q1" if view == "answer" else "t1").decided_by == person


@pytest.mark.parametrize("view", VIEWS)
def test_an_anonymous_visitor_is_sent_to_log_in(client, chat, view):
    target = url(view, chat)

    response = client.post(target, data(view))

    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={target}"
    assert not decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_an_unknown_chat_is_404(owner, chat, view):
    response = owner.post(
        reverse(f"agentloop:{view}", args=[chat.pk + 1000, call("t1").pk]), data(view)
    )

    assert response.status_code == 404


@pytest.mark.parametrize("view", VIEWS)
def test_get_is_405(owner, chat, view):
    response = owner.get(url(view, chat))

    assert response.status_code == 405
    assert not decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_a_post_without_a_csrf_token_is_403(user, chat, view):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post(url(view, chat), data(view))

    assert response.status_code == 403
    assert not decided(view)


@pytest.mark.parametrize("view", VIEWS)
def test_a_post_with_the_csrf_token_is_accepted(user, chat, view):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/admin/login/")  # any page with a form sets the CSRF cookie
    token = client.cookies["csrftoken"].value

    response = client.post(url(view, chat), data(view), headers={"X-CSRFToken": token})

    assert response.status_code == 204
    assert decided(view)


# -- HTML forms are sent back ----------------------------------------------------------------
def test_an_html_form_is_redirected_to_next(owner, chat):
    response = owner.post(
        url("approve", chat), {"next": "/chats/1/"}, headers={"Accept": "text/html"}
    )

    assert (response.status_code, response["Location"]) == (302, "/chats/1/")


def test_an_html_form_is_never_redirected_off_site(owner, chat):
    response = owner.post(
        url("deny", chat), {"next": "https://evil.example/"}, headers={"Accept": "text/html"}
    )

    assert (response.status_code, response["Location"]) == (302, "/")
    assert call("t1").decision == "denied"
