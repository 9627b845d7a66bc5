"""Guardrails are bounded (docs/guardrails.md, "Time limits and cancels"): a guardrail that
does not decide within its time limit (its ``timeout=``, else ``GUARDRAIL_TIMEOUT``) fails
closed with a one-line error, and a cancel stops the run while a guardrail decides, at each
stage, without waiting for it.

The holding guardrails (tests/guardrail_checks.py) wait for the test to release them; each
test asserts that the run ended while the guardrail still held (it had not returned), an
order of events rather than a duration. Real cancels come from another thread, as a page's
request would; tests/test_guardrails_celery.py cancels a worker's job from this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection
from django.test import override_settings

from agentloop import CancelledError, GuardrailError
from agentloop.checks import check_settings
from agentloop.exceptions import ConfigurationError
from agentloop.guardrails import PASS, input_guardrail
from agentloop.models import Chat, ChatState, ToolCall, Usage
from agentloop.testing import reply, stream, tool_call
from tests import guardrail_checks as checks
from tests.helpers import transcript
from tests.tools import charge_card


@pytest.fixture(autouse=True)
def _fresh_holds() -> Iterator[None]:
    checks.forget()
    yield
    checks.release_holds()  # the threads the runs left behind end too


def flag(chat: Chat) -> object:
    return Chat.objects.values_list("cancel_requested_at", flat=True).get(pk=chat.pk)


def outcomes(row) -> list[tuple[str, str, str]]:
    return [(o["guardrail"], o["stage"], o["decision"]) for o in row.guardrails]


def cancel_once_judging(chat: Chat, after: Callable[[], bool] = lambda: True) -> threading.Thread:
    """Another thread cancels ``chat`` through its own instance once a holding guardrail
    has started and ``after()`` is true (as a person's "stop" would come through a page)."""

    def cancel() -> None:
        try:
            assert checks.HOLDS.entered.wait(30)
            deadline = time.monotonic() + 30
            while not after() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert Chat.objects.get(pk=chat.pk).cancel() is True
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    return canceller


def cancelled_while_judging(
    chat: Chat, verb, *args, after: Callable[[], bool] = lambda: True, **kwargs
) -> None:
    """Run ``verb`` while another thread cancels the chat (once ``after()`` is true); it
    raises CancelledError before the holding guardrail returned."""
    canceller = cancel_once_judging(chat, after)
    try:
        with pytest.raises(CancelledError):
            verb(*args, **kwargs)
    finally:
        canceller.join(timeout=30)
    assert checks.HOLDS.entered.is_set()
    assert not checks.HOLDS.returned.is_set()  # the run did not wait for the guardrail


# -- time limits -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_guardrail_past_its_time_limit_fails_closed_with_a_one_line_error(chat, scripted):
    chat.with_guardrails(checks.stalls)
    scripted.add("never sent")

    with pytest.raises(GuardrailError) as raised:
        chat.ask("Hello")

    assert str(raised.value) == (
        "guardrail 'stalls' (input) did not decide within its 0.2 s time limit (its timeout=)"
    )
    assert not checks.HOLDS.returned.is_set()  # the verb did not wait for it
    assert scripted.requests == []  # fails closed: nothing was sent
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert chat.error == f"GuardrailError: {raised.value}"
    user_message = chat.messages.get()
    assert (user_message.content, user_message.status) == ("Hello", "complete")  # kept
    assert outcomes(user_message) == [("stalls", "input", "error")]
    assert user_message.guardrails[0]["reason"] == str(raised.value)


@pytest.mark.django_db
def test_the_setting_bounds_a_guardrail_with_no_limit_of_its_own(chat, scripted):
    chat.with_guardrails(checks.stalls_under_the_setting)
    scripted.add("never sent")

    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "GUARDRAIL_TIMEOUT": 0.2}):
        with pytest.raises(GuardrailError, match=r"0\.2 s time limit \(GUARDRAIL_TIMEOUT\)$"):
            chat.ask("Hello")

    assert not checks.HOLDS.returned.is_set()
    assert scripted.requests == []


@pytest.mark.django_db
def test_an_answer_whose_guardrail_ran_out_of_time_is_kept_blocked(chat, scripted):
    chat.with_guardrails(checks.stalls_async)
    scripted.add("an answer")

    with pytest.raises(GuardrailError, match="'stalls_async' .output. did not decide within"):
        async_to_sync(chat.aask)("Hi")

    assert checks.HOLDS.cancelled == ["stalls_async"]  # an async guardrail's task is cancelled
    assert not checks.HOLDS.returned.is_set()
    answer = chat.messages.get(role="assistant")
    assert (answer.content, answer.status) == ("an answer", "blocked")  # kept, never shown
    assert outcomes(answer) == [("stalls_async", "output", "error")]


def test_a_time_limit_is_a_positive_number_of_seconds():
    for wrong in (0, -1, float("nan"), "5", True):
        with pytest.raises(ConfigurationError, match="timeout= is a positive number of seconds"):
            input_guardrail(timeout=wrong)  # type: ignore[call-overload]

    @input_guardrail(timeout=5)
    def quick(context):
        return PASS

    assert quick.time_limit() == 5.0


def test_the_setting_is_none_or_more_than_zero_seconds():
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "GUARDRAIL_TIMEOUT": 0}):
        (error,) = check_settings()
    assert error.id == "agentloop.E007"
    assert "AGENTLOOP['GUARDRAIL_TIMEOUT'] is invalid" in error.msg
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "GUARDRAIL_TIMEOUT": None}):
        assert check_settings() == []


# -- a cancel while a guardrail decides ----------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_cancel_stops_the_run_while_an_input_guardrail_decides(chat, scripted):
    chat.with_guardrails(checks.holds_input)

    cancelled_while_judging(chat, chat.ask, "Hello")

    assert scripted.requests == []
    assert flag(chat) is None
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    user_message = chat.messages.get()
    assert (user_message.content, outcomes(user_message)) == ("Hello", [])  # not judged yet
    # The message is judged again by the next run, and answered.
    checks.HOLDS.release.set()
    scripted.add("Hi!")
    assert Chat.objects.get(pk=chat.pk).complete().content == "Hi!"
    assert outcomes(chat.messages.get(role="user")) == [("holds_input", "input", "passed")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_cancel_while_an_answer_is_judged_keeps_its_usage_and_none_of_its_text(
    chat, scripted, streamed
):
    chat.with_guardrails(checks.holds_output)
    if streamed:
        scripted.add(stream("An answer ", "nobody judged."))
    else:
        scripted.add("An answer nobody judged.")
    chunks: list[str] = []
    on_chunk = (lambda chunk: chunks.append(chunk.text)) if streamed else None

    # Every chunk saved as it comes: the streamed answer has a partial row.
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "PARTIAL_SAVE_INTERVAL": 0}):
        cancelled_while_judging(chat, chat.ask, "Hello", stream=on_chunk)

    assert flag(chat) is None
    usage = Usage.objects.get(chat=chat)
    assert (usage.status, usage.output_tokens > 0) == ("cancelled", True)  # it was answered
    assert "nobody judged" not in str(transcript(chat, "content"))
    if streamed:  # the streamed partial row ends cancelled, with no text
        assert transcript(chat, "role", "content", "status") == [
            ("user", "Hello", "complete"),
            ("assistant", "", "cancelled"),
        ]
    else:
        assert transcript(chat, "role", "status") == [("user", "complete")]


@pytest.mark.django_db(transaction=True)
def test_a_cancel_stops_the_run_while_a_tool_call_is_judged(chat, scripted, run_log):
    chat.with_guardrails(checks.holds_tool_calls).with_tools(charge_card)
    scripted.add(tool_call("charge_card", {"amount": 5}, id="c1"))

    cancelled_while_judging(chat, chat.ask, "Charge 5")

    assert not run_log.exists()  # the tool never ran
    assert ToolCall.objects.get(chat=chat).state == "cancelled"
    assert flag(chat) is None


@pytest.mark.django_db(transaction=True)
def test_a_cancel_stops_an_async_verb_while_a_guardrail_decides(chat, scripted):
    chat.with_guardrails(checks.holds_input)

    cancelled_while_judging(chat, async_to_sync(chat.aask), "Hello")

    assert scripted.requests == []
    assert flag(chat) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("verb", ["ask", "aask"])
def test_a_cancel_stops_the_wait_for_a_parallel_guardrail_after_the_answer_came(
    chat, scripted, verb
):
    chat.with_guardrails(checks.holds_in_parallel)
    scripted.add(reply("A fast answer."))
    ask = chat.ask if verb == "ask" else async_to_sync(chat.aask)

    # The guardrail starts with the model call: cancel once the answer came (not before the
    # call went out, which a loaded machine made happen once).
    cancelled_while_judging(chat, ask, "Hello", after=lambda: len(scripted.requests) == 1)

    assert len(scripted.requests) == 1
    assert Usage.objects.get(chat=chat).status == "cancelled"
    assert transcript(chat, "role") == [("user",)]  # the unjudged answer is not kept
    assert flag(chat) is None
