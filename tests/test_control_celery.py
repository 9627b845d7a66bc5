"""Control on real ``celery worker`` processes: a tool's halt stops the job's chat before its
next model call, and a deferred tool's result submitted from this process resumes the chat.

Workers, queues and the ``rules`` provider are the Celery tests' (tests/workers.py, the
``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import pytest

from agentloop import DecisionConflictError
from agentloop.models import Chat, ChatState, ToolCall
from tests.control_tools import Guard, ask_accounting
from tests.helpers import transcript
from tests.tools import add
from tests.workers import new_chat, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def test_a_tool_halting_in_a_worker_stops_the_chat_before_the_next_model_call(background, user):
    worker = background.start_worker("w1")
    chat = new_chat(user, Guard, add)
    chat.ask_later("tools:guard,add").complete_later()

    background.wait(lambda: Chat.objects.get(pk=chat.pk).state == ChatState.STOPPED, "the halt")

    chat.refresh_from_db()
    assert chat.stop_reason == "halted: amount 500 is over budget"
    assert transcript(chat, "role", "content", "call_id") == [
        ("user", "tools:guard,add", None),
        ("assistant", "", None),
        ("tool", "over budget: refused", "call_1_0_0"),
        ("tool", "5", "call_1_0_1"),
    ]
    assert len(background.model_calls()) == 1
    background.wait(lambda: "stopped" in worker.outcomes(), "the job to report stopped")
    assert chat.lease_token == ""


def test_a_deferred_result_submitted_here_resumes_the_worker_chat_to_the_end(background, user):
    background.start_worker("w1")
    chat = new_chat(user, ask_accounting)
    chat.ask_later("tools:ask_accounting").complete_later()
    background.wait(lambda: Chat.objects.get(pk=chat.pk).state == ChatState.WAITING, "the wait")
    row = ToolCall.objects.get(chat=chat)
    assert (row.state, row.wait_reason) == ("waiting", "deferred")

    Chat.objects.get(pk=chat.pk).submit_result("call_1_0_0", "paid on the 3rd")
    background.wait(lambda: settled(chat), "the chat to settle")

    assert transcript(chat, "role", "content", "call_id", "status")[-2:] == [
        ("tool", "paid on the 3rd", "call_1_0_0", "complete"),
        ("assistant", "done: paid on the 3rd", None, "complete"),
    ]
    with pytest.raises(DecisionConflictError):
        Chat.objects.get(pk=chat.pk).submit_result("call_1_0_0", "not paid")
    assert len(background.model_calls()) == 2
