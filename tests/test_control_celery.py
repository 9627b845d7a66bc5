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
from tests.tools import add, wait_for_flag
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
    # The stop is recorded under the lease, which the job's release gives up just after.
    background.wait(lambda: "stopped" in worker.outcomes(), "the job to report stopped")
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.STOPPED, "")


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


@pytest.mark.parametrize("where", ["chat", "worker setting"])
def test_a_halt_from_here_while_a_worker_runs_tools_at_once_stops_the_chat(background, user, where):
    """halt() from this process while the worker's round runs its tools at once (the chat's
    ``with_tool_options(concurrency=...)``, or the worker's TOOL_CONCURRENCY): the round
    finishes, no model call follows, the chat is ``stopped`` with the reason."""
    options = {"TOOL_CONCURRENCY": "threads"} if where == "worker setting" else {}
    worker = background.start_worker("w1", flag=True, **options)
    chat = new_chat(user, wait_for_flag, add)
    if where == "chat":
        chat.with_tool_options(concurrency="threads")
    chat.ask_later("tools:wait_for_flag,add").complete_later()
    background.wait(lambda: "wait_for_flag" in background.runs(), "the round to start")

    assert Chat.objects.get(pk=chat.pk).halt("operator stop") is True
    (background.tmp / "never-created").touch()  # the held tool may finish now
    # The job reports "stopped" once its release has committed (the state comes just before).
    background.wait(lambda: "stopped" in worker.outcomes(), "the job to report stopped")

    chat.refresh_from_db()
    assert (chat.stop_reason, chat.halt_reason, chat.lease_token) == (
        "halted: operator stop",
        "",
        "",
    )
    assert sorted(transcript(chat, "role", "content", "call_id")[2:]) == [
        ("tool", "5", "call_1_0_1"),
        ("tool", "flag seen", "call_1_0_0"),
    ]
    assert chat.state == ChatState.STOPPED
    assert len(background.model_calls()) == 1
