"""The admin's approval inbox: every call waiting for a person across chats, filtered by kind,
tool, owner and age; approve, deny, approve with edited arguments or answer, through the
chats' own verbs (the views' validation and conflict rules); who decided and when.
(In a real browser: tests/test_approval_inbox_browser.py.)"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from tests.tools import ask_manager, transfer

pytestmark = pytest.mark.django_db

INBOX = reverse("admin:agentloop_chat_inbox")


def decide_url(call: ToolCall, query: str = "") -> str:
    url = reverse("admin:agentloop_chat_inbox_decide", args=[call.pk])
    return f"{url}?{query}" if query else url


def waiting_call(scripted, owner, *, amount=5, tool="transfer", title="") -> ToolCall:
    """A chat of ``owner`` stopped at a call waiting for a person (approval or question)."""
    chat = Chat.objects.create(model="scripted:test", owner=owner, title=title)
    chat.with_tools(transfer, ask_manager)
    arguments = {"amount": amount, "to": "bob"} if tool == "transfer" else {"question": "Why?"}
    scripted.add(tool_call(tool, arguments))
    chat.ask("Go")
    return ToolCall.objects.get(chat=chat)


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="pw")


@pytest.fixture
def calls(scripted, user, bob):
    return [
        waiting_call(scripted, user, amount=10, title="ada pays"),
        waiting_call(scripted, bob, amount=20, title="bob pays"),
        waiting_call(scripted, bob, tool="ask_manager", title="bob asks"),
    ]


def listed(response) -> list[int]:
    return [int(pk) for pk in re.findall(r'data-call="(\d+)"', response.content.decode())]


# -- the list -------------------------------------------------------------------------------------
def test_the_inbox_lists_every_call_waiting_for_a_person_oldest_first(admin_client, calls):
    ToolCall.objects.filter(pk=calls[2].pk).update(
        waiting_since=timezone.now() - timedelta(hours=2)
    )
    response = admin_client.get(INBOX)

    assert response.status_code == 200
    assert listed(response) == [calls[2].pk, calls[0].pk, calls[1].pk]
    page = response.content.decode()
    assert "3 tool calls" in page
    assert "Why?" in page  # the question


def test_calls_that_wait_for_nobody_are_not_listed(admin_client, calls):
    ToolCall.objects.filter(pk=calls[0].pk).update(wait_reason="subagent")
    ToolCall.objects.filter(pk=calls[1].pk).update(state="succeeded")
    assert listed(admin_client.get(INBOX)) == [calls[2].pk]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("kind=approval", [0, 1]),
        ("kind=question", [2]),
        ("tool=transfer", [0, 1]),
        ("tool=ask_manager", [2]),
        ("owner=mine", []),
        ("owner=none", []),
        ("age=1h", [1]),
        ("kind=approval&age=1h", [1]),
    ],
)
def test_the_filters(admin_client, calls, query, expected):
    ToolCall.objects.filter(pk=calls[1].pk).update(
        waiting_since=timezone.now() - timedelta(hours=3)
    )
    found = listed(admin_client.get(f"{INBOX}?{query}"))
    assert sorted(found) == sorted(calls[i].pk for i in expected)


def test_the_owner_filter_takes_a_user(admin_client, calls, bob):
    response = admin_client.get(f"{INBOX}?owner={bob.pk}")
    assert listed(response) == [calls[1].pk, calls[2].pk]
    assert f'<option value="{bob.pk}" selected>bob</option>' in response.content.decode()


def test_each_owner_links_to_their_calls_only(admin_client, calls, bob):
    page = admin_client.get(f"{INBOX}?kind=approval").content.decode()
    assert f'href="?kind=approval&amp;owner={bob.pk}"' in page


def test_an_owner_that_is_no_key_is_a_bad_request(admin_client, calls):
    assert admin_client.get(f"{INBOX}?owner=abc").status_code == 400


def test_a_page_costs_the_same_queries_whatever_it_lists(
    admin_client, scripted, user, django_assert_num_queries
):
    waiting_call(scripted, user)
    admin_client.get(INBOX)  # the session and the user, loaded once
    # session, user, count, the page's calls (their chats and owners joined), the tools.
    with django_assert_num_queries(5):
        assert len(listed(admin_client.get(INBOX))) == 1
    for _ in range(6):
        waiting_call(scripted, user)
    with django_assert_num_queries(5):
        assert len(listed(admin_client.get(INBOX))) == 7


def test_the_page_is_paginated(admin_client, scripted, user):
    made = [waiting_call(scripted, user) for _ in range(27)]
    first = admin_client.get(INBOX)
    second = admin_client.get(f"{INBOX}?kind=approval&page=2")
    assert len(listed(first)) == 25
    assert listed(second) == [made[25].pk, made[26].pk]
    assert "page 2 of 2" in second.content.decode()


def test_model_and_tool_text_is_escaped(admin_client, scripted, user):
    call = waiting_call(scripted, user, title="<script>alert(1)</script>")
    ToolCall.objects.filter(pk=call.pk).update(
        arguments={"to": "<img src=x onerror=alert(2)>", "amount": 1}, question="<b>q</b>"
    )
    page = admin_client.get(INBOX).content.decode()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(2)&gt;" in page


def test_the_chat_list_links_to_the_inbox(admin_client):
    page = admin_client.get(reverse("admin:agentloop_chat_changelist")).content.decode()
    assert f'href="{INBOX}"' in page


# -- permissions ----------------------------------------------------------------------------------
def test_a_viewer_sees_the_inbox_without_forms_and_cannot_decide(viewer, calls):
    response = viewer.get(INBOX)
    assert listed(response) == [call.pk for call in calls]
    assert "inbox_decide" not in response.content.decode()
    assert 'action="/admin/agentloop/chat/inbox/' not in response.content.decode()

    refused = viewer.post(decide_url(calls[0]), {"decision": "approve"})

    assert refused.status_code == 403
    assert ToolCall.objects.get(pk=calls[0].pk).decision == ""


def test_staff_without_chat_permissions_get_no_inbox(client, django_user_model, calls):
    staff = django_user_model.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(INBOX).status_code == 403


def test_people_who_are_not_staff_are_sent_to_the_login(client, user, calls):
    client.force_login(user)
    response = client.post(decide_url(calls[0]), {"decision": "approve"})
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert ToolCall.objects.get(pk=calls[0].pk).decision == ""


def test_deciding_is_post_only_and_needs_the_csrf_token(django_user_model, calls):
    from django.test import Client

    root = django_user_model.objects.create_superuser("root", password="pw")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(root)
    assert strict.get(decide_url(calls[0])).status_code == 405
    assert strict.post(decide_url(calls[0]), {"decision": "approve"}).status_code == 403
    assert ToolCall.objects.get(pk=calls[0].pk).decision == ""


# -- decisions ------------------------------------------------------------------------------------
def test_approving_runs_the_call_and_records_who_and_when(
    admin_client, admin_user, calls, scripted
):
    scripted.add("Paid.")
    response = admin_client.post(decide_url(calls[0], "kind=approval"), {"decision": "approve"})

    assert response.status_code == 302
    assert response["Location"] == f"{INBOX}?kind=approval"  # back, the filters kept
    call = ToolCall.objects.get(pk=calls[0].pk)
    assert (call.decision, call.decided_by, call.state) == ("approved", admin_user, "pending")
    assert call.decided_at is not None
    entry = LogEntry.objects.get(object_id=str(call.chat_id))
    assert entry.change_message == f"Approved tool call transfer ({call.call_id}) from the inbox."


def test_denying_gives_the_model_the_reason(admin_client, calls):
    admin_client.post(decide_url(calls[0]), {"decision": "deny", "reason": "not today"})
    call = ToolCall.objects.get(pk=calls[0].pk)
    assert (call.decision, call.decision_reason) == ("denied", "not today")
    assert "not today" in call.result.content and call.result.is_error


def test_a_denial_without_a_reason_gives_the_default_one(admin_client, calls):
    admin_client.post(decide_url(calls[0]), {"decision": "deny", "reason": "  "})
    assert ToolCall.objects.get(pk=calls[0].pk).decision_reason == (
        "Denied by a reviewer in the admin."
    )


def test_approving_with_edited_arguments_runs_them_and_keeps_the_models(admin_client, calls):
    edited = json.dumps({"amount": 3, "to": "bob"})
    admin_client.post(decide_url(calls[0]), {"decision": "approve_edited", "arguments": edited})

    call = ToolCall.objects.get(pk=calls[0].pk)
    assert call.arguments == {"amount": 3, "to": "bob"}
    assert call.original_arguments == {"amount": 10, "to": "bob"}
    assert call.decision == "approved"
    assert "with edited arguments" in LogEntry.objects.get().change_message


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ('{"amount": "lots", "to": "bob"}', "Invalid arguments for tool &#x27;transfer&#x27;"),
        ('{"amount": 3, "to": "bob", "memo": "x"}', "memo"),
        ('{"amount": 3,', "The arguments are not JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_invalid_edited_arguments_change_nothing_and_say_why(admin_client, calls, arguments, why):
    response = admin_client.post(
        decide_url(calls[0]), {"decision": "approve_edited", "arguments": arguments}
    )

    assert response.status_code == 400
    page = response.content.decode()
    assert why in page
    assert "Nothing was changed." in page
    assert json.dumps(arguments)[1:-1].replace('\\"', "&quot;") in page  # the draft, kept
    call = ToolCall.objects.get(pk=calls[0].pk)
    assert (call.state, call.decision, call.arguments) == (
        "waiting",
        "",
        {"amount": 10, "to": "bob"},
    )
    assert call.original_arguments is None
    assert not LogEntry.objects.exists()


def test_answering_a_question(admin_client, admin_user, calls):
    admin_client.post(decide_url(calls[2]), {"decision": "answer", "text": "Because."})
    call = ToolCall.objects.get(pk=calls[2].pk)
    assert (call.decision, call.decided_by, call.result.content) == (
        "answered", admin_user, "Because.",
    )  # fmt: skip


def test_an_empty_answer_changes_nothing(admin_client, calls):
    response = admin_client.post(decide_url(calls[2]), {"decision": "answer", "text": " "})
    assert response.status_code == 400
    assert "Type an answer first." in response.content.decode()
    assert ToolCall.objects.get(pk=calls[2].pk).decision == ""


def test_an_unknown_decision_is_a_bad_request(admin_client, calls):
    assert admin_client.post(decide_url(calls[0]), {"decision": "maybe"}).status_code == 400


def test_a_decision_that_lost_the_race_says_who_decided_first_and_when(admin_client, calls, bob):
    Chat.objects.get(pk=calls[0].chat_id).deny(calls[0].pk, reason="no", by=bob)

    response = admin_client.post(decide_url(calls[0]), {"decision": "approve"}, follow=True)

    page = response.content.decode()
    assert "was already denied by bob at" in page
    assert ToolCall.objects.get(pk=calls[0].pk).decision == "denied"


def test_a_call_that_is_gone_is_said_so(admin_client, calls):
    Chat.objects.filter(pk=calls[0].chat_id).delete()
    response = admin_client.post(decide_url(calls[0]), {"decision": "approve"}, follow=True)
    assert "That tool call no longer exists." in response.content.decode()


@pytest.mark.django_db(transaction=True)  # the chat's job is sent on commit
def test_a_background_chat_goes_on_once_its_call_is_approved(admin_client, calls, scripted):
    Chat.objects.filter(pk=calls[0].chat_id).update(state=ChatState.WAITING)
    scripted.add("Paid.")
    admin_client.post(decide_url(calls[0]), {"decision": "approve"})
    wait_for_embedded_jobs()
    chat = Chat.objects.get(pk=calls[0].chat_id)
    assert chat.state == ChatState.IDLE
    assert chat.messages.last().content == "Paid."


# -- decided --------------------------------------------------------------------------------------
def test_the_decided_view_shows_who_decided_and_when_newest_first(admin_client, calls, bob, user):
    Chat.objects.get(pk=calls[0].chat_id).deny(calls[0].pk, reason="too much", by=bob)
    Chat.objects.get(pk=calls[1].chat_id).approve(calls[1].pk, by=user)

    response = admin_client.get(f"{INBOX}?view=decided")

    assert listed(response) == [calls[1].pk, calls[0].pk]
    page = response.content.decode()
    assert "Approved by ada" in page
    assert "Denied by bob" in page and "too much" in page
    assert '<form method="post"' not in page  # nothing left to decide there


@override_settings(TIME_ZONE="UTC")
def test_the_decided_view_filters_by_tool(admin_client, calls, user):
    Chat.objects.get(pk=calls[2].chat_id).answer(calls[2].pk, "ok", by=user)
    Chat.objects.get(pk=calls[0].chat_id).approve(calls[0].pk, by=user)
    assert listed(admin_client.get(f"{INBOX}?view=decided&tool=ask_manager")) == [calls[2].pk]
