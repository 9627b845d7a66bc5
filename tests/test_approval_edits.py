"""approve(call, arguments=...): edited arguments checked by the tool's Params, run, the
model's kept; the approve view takes them too (400 on invalid ones). APPROVAL_TIMEOUT: the
sweeper denies calls that waited too long."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

import agentloop
from agentloop import InvalidArgumentsError
from agentloop.engine._tool_rounds import DENIED_RESULT
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.runners.approval_timeouts import deny_timed_out_approvals
from agentloop.runners.sweeper import resume_stalled
from agentloop.testing import tool_call
from tests.tools import transfer

PAY_BOB = tool_call("transfer", {"amount": 500, "to": "bob"}, id="t1")


# -- in memory ------------------------------------------------------------------------------------
@pytest.fixture
def memory(scripted):
    chat = agentloop.chat("scripted:test", tools=[transfer])
    scripted.add(PAY_BOB, "Paid.")
    chat.ask("Pay Bob 500")
    return chat


def test_an_approval_with_edited_arguments_runs_the_call_with_them(memory, scripted):
    memory.approve("t1", by="ada", arguments={"amount": 50, "to": "bob"})
    assert memory.complete().content == "Paid."

    (result,) = [m for m in memory.messages if m.role == "tool"]
    assert result.content == "sent 50 to bob"
    (call,) = [c for m in memory.messages for c in m.tool_calls]
    assert call.arguments == {"amount": 50, "to": "bob"}
    assert call.original_arguments == {"amount": 500, "to": "bob"}
    assert call.decision_digest == call.arguments_digest()
    # The model hears of the call as it ran.
    assert scripted.requests[1].messages[1].tool_calls[0].arguments == {"amount": 50, "to": "bob"}


def test_invalid_edited_arguments_are_refused_in_one_line_and_nothing_is_written(memory):
    with pytest.raises(InvalidArgumentsError) as error:
        memory.approve("t1", arguments={"amount": "lots", "to": "bob"})

    assert "\n" not in str(error.value)
    assert str(error.value).startswith("Invalid arguments for tool 'transfer': amount:")
    (waiting,) = memory.pending_approvals()
    assert (waiting.arguments, waiting.decision, waiting.original_arguments) == (
        {"amount": 500, "to": "bob"},
        None,
        None,
    )


@pytest.mark.parametrize("arguments", [["amount", 5], {"amount": 5}, {"amount": 5, "to": object()}])
def test_arguments_that_are_not_a_complete_json_object_are_refused(memory, arguments):
    with pytest.raises(InvalidArgumentsError):
        memory.approve("t1", arguments=arguments)
    assert len(memory.pending_approvals()) == 1


def test_an_approval_with_the_same_arguments_keeps_no_original(memory):
    memory.approve("t1", arguments={"amount": 500, "to": "bob"})
    memory.complete()
    (call,) = [c for m in memory.messages for c in m.tool_calls]
    assert call.original_arguments is None


# -- persisted ------------------------------------------------------------------------------------
@pytest.fixture
def chat(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(PAY_BOB, "Paid.")
    chat.ask("Pay Bob 500")
    return chat


@pytest.mark.django_db
def test_a_persisted_approval_with_edited_arguments_keeps_the_original_on_the_row(chat, user):
    chat.approve("t1", by=user, arguments={"amount": 50, "to": "bob"})
    row = ToolCall.objects.get(call_id="t1")
    assert (row.arguments, row.original_arguments) == (
        {"amount": 50, "to": "bob"},
        {"amount": 500, "to": "bob"},
    )
    assert row.decided_by == user

    assert chat.complete().content == "Paid."
    assert chat.messages.get(role="tool").content == "sent 50 to bob"


@pytest.mark.django_db
def test_the_approval_digest_binds_the_edited_arguments(chat):
    chat.approve("t1", arguments={"amount": 50, "to": "bob"})
    # Arguments changed behind the approval's back don't run: the call waits again.
    ToolCall.objects.filter(call_id="t1").update(arguments={"amount": 5000, "to": "bob"})
    chat.complete()
    assert not chat.messages.filter(role="tool").exists()
    assert [c.call_id for c in chat.pending_approvals()] == ["t1"]


@pytest.mark.django_db
def test_invalid_edited_arguments_leave_the_persisted_call_waiting(chat):
    with pytest.raises(InvalidArgumentsError, match="to: Field required"):
        chat.approve("t1", arguments={"amount": 50})
    row = ToolCall.objects.get(call_id="t1")
    assert (row.state, row.decision, row.original_arguments) == ("waiting", "", None)


@pytest.mark.django_db
def test_the_admin_timeline_shows_the_original_arguments(admin_client, chat):
    chat.approve("t1", arguments={"amount": 50, "to": "bob"})
    chat.complete()

    content = admin_client.get(reverse("admin:agentloop_chat_change", args=[chat.pk])).content
    page = content.decode()

    assert "Arguments edited by the approver; the model asked for:" in page
    # Both versions are shown (whatever order the database keeps the keys in).
    assert re.search(r"&quot;amount&quot;: 500(?!\d)", page)
    assert re.search(r"&quot;amount&quot;: 50(?!\d)", page)


# -- the approve view -----------------------------------------------------------------------------
@pytest.fixture
def owner_client(client, user):
    client.force_login(user)
    return client


def approve_url(chat):
    return reverse("agentloop:approve", args=[chat.pk, ToolCall.objects.get(call_id="t1").pk])


@pytest.mark.django_db
def test_the_approve_view_takes_edited_arguments(owner_client, chat):
    edited = json.dumps({"amount": 50, "to": "bob"})
    response = owner_client.post(approve_url(chat), {"arguments": edited})
    assert response.status_code == 204
    row = ToolCall.objects.get(call_id="t1")
    assert (row.decision, row.arguments["amount"], row.original_arguments["amount"]) == (
        "approved",
        50,
        500,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("posted", ['{"amount": "lots", "to": "bob"}', "{not json", "[1, 2]"])
def test_the_approve_view_answers_400_to_invalid_arguments_and_leaves_the_call_waiting(
    owner_client, chat, posted
):
    response = owner_client.post(approve_url(chat), {"arguments": posted})
    assert response.status_code == 400
    assert response.content.decode().count("\n") == 0
    row = ToolCall.objects.get(call_id="t1")
    assert (row.state, row.decision) == ("waiting", "")


# -- APPROVAL_TIMEOUT -----------------------------------------------------------------------------
def waited(seconds: float) -> None:
    """Make the waiting call look as if it had waited ``seconds`` already."""
    since = timezone.now() - timedelta(seconds=seconds)
    ToolCall.objects.filter(call_id="t1").update(waiting_since=since)


@pytest.mark.django_db
def test_the_sweeper_denies_an_approval_waiting_longer_than_the_timeout(chat):
    waited(61)
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "APPROVAL_TIMEOUT": 60}):
        resume_stalled()

    row = ToolCall.objects.get(call_id="t1")
    assert (row.decision, row.decision_reason, row.decided_by) == (
        "denied",
        "approval timed out",
        None,
    )
    result = chat.messages.get(role="tool")
    assert (result.content, result.is_error) == (
        f"{DENIED_RESULT} Reason: approval timed out",
        True,
    )
    assert chat.complete().content == "Paid."  # the model hears of it and answers


@pytest.mark.django_db
@pytest.mark.parametrize(("timeout", "seconds"), [(60, 59), (None, 10**6)])
def test_the_sweeper_leaves_approvals_within_the_timeout_or_without_one(chat, timeout, seconds):
    waited(seconds)
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "APPROVAL_TIMEOUT": timeout}):
        assert deny_timed_out_approvals() == []
    assert ToolCall.objects.get(call_id="t1").state == "waiting"


@pytest.mark.django_db(transaction=True)
def test_a_timed_out_approval_resumes_a_background_chat_to_the_end(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(PAY_BOB, "Not paid: nobody approved in time.")
    agentloop_settings = {**settings.AGENTLOOP, "BACKGROUND": "embedded", "APPROVAL_TIMEOUT": 60}
    with override_settings(AGENTLOOP=agentloop_settings):
        chat.ask_later("Pay Bob 500").complete_later()
        assert wait_for_embedded_jobs(60)
        chat.refresh_from_db()
        assert chat.state == ChatState.WAITING
        assert ToolCall.objects.get(call_id="t1").waiting_since is not None

        waited(120)
        resume_stalled()
        assert wait_for_embedded_jobs(60)

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    last = chat.messages.order_by("id").last()
    assert last.content == "Not paid: nobody approved in time."
    scripted.assert_complete()
