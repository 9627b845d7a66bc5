"""Guardrails on real ``celery worker`` processes: the worker loads them from the chat's
import paths and they act as in this process (a block stops the job's chat, a replacement is
what the model is sent, a tool block is the model's error result, a parallel guardrail's block
abandons the call, a failing one fails the chat with its error), and a cancel stops a job
while a guardrail decides, without waiting for it.

Workers, queues and the ``rules`` provider (its answer echoes the message; "tools:..." asks
for tool rounds) are the Celery tests' (tests/workers.py, the ``background`` fixture).
"""

from __future__ import annotations

import pytest

from agentloop.models import Chat, ChatState, ToolCall, Usage
from tests import guardrail_checks as checks
from tests.helpers import transcript
from tests.tools import add, charge_card
from tests.workers import new_chat, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def stopped(chat: Chat) -> bool:
    chat.refresh_from_db()
    return chat.state == ChatState.STOPPED and not chat.lease_token


def test_a_blocked_message_stops_the_workers_chat_with_no_model_call(background, user):
    worker = background.start_worker("w1")
    chat = new_chat(user).with_guardrails(checks.no_secrets)
    chat.ask_later("tell the secret").complete_later()

    background.wait(lambda: stopped(chat), "the block")

    assert chat.stop_reason == "guardrail no_secrets: the message mentions a secret"
    assert transcript(chat, "role", "status") == [("user", "blocked")]
    assert background.model_calls() == []
    background.wait(lambda: "stopped" in worker.outcomes(), "the job to report stopped")


def test_a_worker_sends_the_replaced_text_and_blocks_a_leaking_answer(background, user):
    background.start_worker("w1")
    chat = new_chat(user).with_guardrails(checks.redact_cards, checks.no_leaks)
    chat.ask_later("card 4242 4242 4242 4242").complete_later()
    background.wait(lambda: settled(chat), "the answer")

    assert transcript(chat, "role", "content") == [
        ("user", "card [card]"),
        ("assistant", "echo: card [card]"),
    ]

    chat.ask_later("a LEAK").complete_later()
    background.wait(lambda: stopped(chat), "the answer's block")
    assert chat.stop_reason == "guardrail no_leaks: the answer leaks internal data"
    assert transcript(chat, "role", "content", "status")[-1] == (
        "assistant",
        "echo: a LEAK",
        "blocked",
    )


def test_a_tool_guardrail_in_a_worker_blocks_and_rewrites_calls(background, user):
    background.start_worker("w1")
    chat = new_chat(user, charge_card, add).with_guardrails(checks.cap_charges, checks.tenfold)
    # charge_card asks for 42 (tests/worker_provider.ARGUMENTS): over the cap.
    chat.ask_later("tools:charge_card,add").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    assert background.runs() == []  # charge_card, which logs each run, never ran
    results = {row.tool_call.name: row.content for row in chat.messages.filter(role="tool")}
    assert results == {
        "charge_card": "Blocked by guardrail cap_charges: charges over 40 need a person; "
        "the tool was not run.",
        "add": "23",  # 2 + 3 with a rewritten tenfold: 20 + 3
    }
    calls = {call.name: call for call in ToolCall.objects.filter(chat=chat)}
    assert calls["add"].arguments == {"a": 20, "b": 3}
    assert [o["decision"] for o in calls["charge_card"].guardrails] == ["blocked"]


def test_a_parallel_block_in_a_worker_abandons_the_call_and_keeps_no_answer(background, user):
    background.start_worker("w1")
    chat = new_chat(user).with_guardrails(checks.timed_moderation)
    # 40 chunks 0.1 s apart: the guardrail decides long before the stream would end.
    chat.ask_later("stream:40:0.1 forbidden").complete_later()

    background.wait(lambda: stopped(chat), "the block")

    assert chat.stop_reason == "guardrail timed_moderation: moderation flagged the message"
    assert transcript(chat, "role", "status") == [("user", "blocked")]
    assert len(background.model_calls()) == 1
    usage = Usage.objects.get(chat=chat)
    assert (usage.status, usage.error) == (
        "cancelled",
        "abandoned: the input guardrails did not pass the message",
    )


def test_a_guardrail_failing_in_a_worker_fails_the_chat_with_its_error(background, user):
    background.start_worker("w1")
    chat = new_chat(user).with_guardrails(checks.explodes)
    chat.ask_later("boom").complete_later()

    background.wait(lambda: Chat.objects.get(pk=chat.pk).state == ChatState.FAILED, "the failure")

    chat.refresh_from_db()
    assert chat.error == (
        "GuardrailError: guardrail 'explodes' (input) raised RuntimeError: the moderation "
        "service is down"
    )
    assert transcript(chat, "role", "content", "status") == [("user", "boom", "complete")]
    assert background.model_calls() == []


def test_a_cancel_stops_a_workers_job_while_a_guardrail_decides(background, user):
    # The guardrail holds until killed (a flag file nobody creates; its timeout is 120 s).
    worker = background.start_worker("w1", flag=True)
    chat = new_chat(user).with_guardrails(checks.holds_for_the_flag)
    chat.ask_later("Hello").complete_later()
    background.wait(lambda: "holds_for_the_flag:started" in background.runs(), "the guardrail")

    assert Chat.objects.get(pk=chat.pk).cancel() is True  # as the cancel view does

    background.wait(lambda: "cancelled" in worker.outcomes(), "the job to end cancelled")
    assert "holds_for_the_flag:returned" not in background.runs()  # it did not wait for it
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token, chat.cancel_requested_at) == (ChatState.IDLE, "", None)
    assert background.model_calls() == []
    assert transcript(chat, "role", "status") == [("user", "complete")]  # kept, to judge again
