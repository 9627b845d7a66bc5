"""Bad bytes and bad numbers lose nothing (issue 41, defects 1 and 9; docs/operations.md
"Bad bytes and bad numbers"), on SQLite and PostgreSQL.

Defect 1: a NUL byte or a lone surrogate in a model's answer, its thinking, a tool's arguments
or result, an error or a user's useChat text made the step's write fail on PostgreSQL (and a
lone surrogate on SQLite too): the answer was lost with its usage row, a tool ran again on
every resume, useChat answered 500. Negative token counts from a provider failed the same
write. Now every text is stored with U+FFFD in their place, on both databases alike.

Defect 9: a provider's cost went unchecked: a negative cost credited the budget, a NaN cost
failed the chat and wrote no usage row. Now a cost that is no price is recorded as unknown
(an absurd one as the most a row holds), with a warning; token counts alike.

The properties over any text and any number are in tests/test_bad_input_properties.py.
"""

from __future__ import annotations

import json
import logging
import math
from decimal import Decimal

import pytest
from django.urls import reverse

from agentloop import BudgetExceededError, providers
from agentloop.budgets import spend_of
from agentloop.exceptions import AuthenticationError
from agentloop.messages import MAX_COST, MAX_TOKENS, TokenUsage, checked_cost, token_count
from agentloop.models import Chat, ChatState, Message, ToolCall, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import reply, stream, tool_call
from tests import bad_input
from tests.bad_input import FAMILIES, CostedProvider, echo, spoiled
from tests.budget_helpers import counters
from tests.providers import cassettes

pytestmark = pytest.mark.django_db

#: the bad bytes: what each becomes once stored.
BAD = {
    "nul": ("before\x00after", "before\ufffdafter"),
    "lone-surrogate": ("before\ud800after", "before\ufffdafter"),
}


@pytest.fixture
def warnings_logged(caplog):
    caplog.set_level(logging.WARNING, logger="agentloop")
    return caplog


def warning_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


# -- defect 1: bad bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize(("sent", "kept"), BAD.values(), ids=BAD.keys())
def test_an_answer_and_its_thinking_with_bad_bytes_are_kept_with_their_usage_row(
    scripted, user, sent, kept
):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(reply(sent, thinking=sent, usage=TokenUsage(input_tokens=7, output_tokens=3)))

    chat.ask("Hi")

    answer = Message.objects.get(chat=chat, role="assistant")
    assert (answer.content, answer.thinking, answer.status) == (kept, kept, "complete")
    usage = Usage.objects.get(chat=chat)
    assert (usage.message_id, usage.input_tokens, usage.output_tokens) == (answer.pk, 7, 3)
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE


@pytest.mark.parametrize(("sent", "kept"), BAD.values(), ids=BAD.keys())
def test_a_streamed_answer_with_bad_bytes_is_kept(scripted, user, sent, kept):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(stream("one ", sent, " two"))

    answer = chat.ask("Hi", stream=lambda chunk: None)

    answer.refresh_from_db()
    assert answer.content == f"one {kept} two"
    assert Usage.objects.filter(chat=chat, message=answer).count() == 1


def test_negative_token_counts_from_a_provider_are_counted_as_zero_and_the_answer_kept(
    user, warnings_logged
):
    family = next(family for family in FAMILIES if family.name == "anthropic")
    recorded = family.interaction(streamed=False)
    counts = iter([-16, -13])  # the recording's input and output tokens, made negative
    answer = bad_input.rewritten(recorded, "Four.", lambda: next(counts, 0))
    replay = cassettes.Cassette("negative", [answer])
    providers.register("anthropic", AnthropicProvider(api_key="k", transport=replay.transport()))
    try:
        chat = Chat.objects.create(model=family.model, owner=user)
        assert chat.ask("2 + 2?").content == "Four."
    finally:
        providers.unregister("anthropic")

    usage = Usage.objects.get(chat=chat)
    assert (usage.status, usage.input_tokens, usage.output_tokens) == ("succeeded", 0, 0)
    assert "A provider reported input_tokens=-16: counted as 0." in warning_lines(warnings_logged)


@pytest.mark.django_db(transaction=True)  # each try commits, or fails, as in production
@pytest.mark.parametrize("kind", BAD.keys())
def test_a_tool_result_with_bad_bytes_is_kept_and_the_tool_runs_once_across_resumes(
    scripted, user, kind
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(spoiled)
    scripted.add(tool_call("spoiled", {"kind": kind}), "Done.", "Still here.")
    bad_input.RUNS.clear()
    failures = []

    for resume in range(3):  # the run, then two resumes (each ran the tool again before)
        try:
            chat.complete() if resume else chat.ask("Spoil it")
        except Exception as exc:  # noqa: BLE001 - what each try raised is the finding
            failures.append(f"{type(exc).__name__}: {exc}")

    assert bad_input.RUNS == [kind]
    assert failures == []
    assert ToolCall.objects.get(chat=chat).state == "succeeded"
    assert Message.objects.get(chat=chat, role="tool").content == BAD[kind][1]
    assert chat.ask("Anything else?").content == "Still here."  # not PendingToolCallsError


@pytest.mark.parametrize(("sent", "kept"), BAD.values(), ids=BAD.keys())
def test_tool_arguments_with_bad_bytes_are_kept_and_the_tool_runs_once(scripted, user, sent, kept):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(echo)
    scripted.add(tool_call("echo", {"text": sent}), "Done.")
    bad_input.RUNS.clear()

    chat.ask("Echo it")

    assert bad_input.RUNS == [sent]  # the tool got the model's arguments as they came
    call = ToolCall.objects.get(chat=chat)
    assert (call.state, call.arguments) == ("succeeded", {"text": kept})
    assert Message.objects.get(chat=chat, role="tool").content == kept


@pytest.mark.parametrize(("sent", "kept"), BAD.values(), ids=BAD.keys())
def test_an_error_with_bad_bytes_is_kept_on_the_failed_chat(scripted, user, sent, kept):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(AuthenticationError(f"the gateway said {sent}"))

    with pytest.raises(AuthenticationError):
        chat.ask("Hi")

    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert f"the gateway said {kept}" in chat.error
    usage = Usage.objects.get(chat=chat)
    assert usage.status == "failed" and f"the gateway said {kept}" in usage.error


@pytest.mark.django_db(transaction=True)  # the run goes on in the embedded runner's thread
@pytest.mark.parametrize(("sent", "kept"), BAD.values(), ids=BAD.keys())
def test_usechat_text_with_bad_bytes_is_answered_not_a_500(
    owner, user, scripted, settings, sent, kept
):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_POLL_INTERVAL": 0.02}
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add("Understood.")
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": sent}]}
    payload = {"id": str(chat.pk), "messages": [message], "trigger": "submit-message"}

    response = owner.post(reverse("agentloop:usechat"), json.dumps(payload), "application/json")

    assert response.status_code == 200, response.content
    body = b"".join(response.streaming_content).decode()
    assert '"finishReason":"stop"' in body and body.endswith("data: [DONE]\n\n")
    assert wait_for_embedded_jobs(30)
    assert list(chat.messages.values_list("role", "content")) == [
        ("user", kept),
        ("assistant", "Understood."),
    ]
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE


def shown_text(body: str) -> str:
    """The text a useChat client shows from a UI message stream (a reset-step drops the
    text its step streamed so far: the step's text follows again)."""
    shown: list[str] = []
    step: list[str] = []
    for event in body.split("\n\n"):
        if not event.startswith("data: {"):
            continue
        part = json.loads(event[len("data: ") :])
        if part["type"] == "start-step":
            shown, step = shown + step, []
        elif part["type"] == "reset-step":
            step = []
        elif part["type"] == "text-delta":
            step.append(part["delta"])
    return "".join(shown + step)


@pytest.mark.django_db(transaction=True)  # the run goes on in the embedded runner's thread
def test_an_answer_with_a_lone_surrogate_streams_to_usechat_through_redis(
    owner, user, scripted, settings, redis_events
):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_POLL_INTERVAL": 0.02}
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(stream("one ", "\ud800", " two"))
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}
    payload = {"id": str(chat.pk), "messages": [message], "trigger": "submit-message"}

    response = owner.post(reverse("agentloop:usechat"), json.dumps(payload), "application/json")
    body = b"".join(response.streaming_content).decode()

    assert body.endswith("data: [DONE]\n\n")
    assert shown_text(body) == "one \ufffd two"
    assert wait_for_embedded_jobs(30)
    assert chat.messages.get(role="assistant").content == "one \ufffd two"


# -- defect 9: a provider's numbers ----------------------------------------------------------------
@pytest.fixture
def costed(settings):
    """The "costed" model, priced by the test, under a daily cost budget of $1.00."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_day": "1.00"}}
    provider = CostedProvider()
    providers.register("costed", provider)
    yield provider
    providers.unregister("costed")


def test_a_negative_cost_is_recorded_as_unknown_and_never_credits_the_budget(
    costed, user, warnings_logged
):
    costed.price = Decimal("-5.00")
    costed.add("Fine.", "Fine again.")
    chat = Chat.objects.create(model="costed:test", owner=user)

    chat.ask("Hi")
    chat.ask("Hi again")

    assert list(Usage.objects.filter(chat=chat).values_list("cost", flat=True)) == [None, None]
    spend = spend_of(user)
    assert (spend.cost_per_day, spend.reserved_cost) == (0, 0)
    assert counters(f"auth.user:{user.pk}")["day_cost"] == 0
    assert "The cost of test is Decimal('-5.00'): recorded as unknown." in warning_lines(
        warnings_logged
    )


@pytest.mark.parametrize("price", [Decimal("NaN"), float("nan")], ids=["decimal", "float"])
def test_a_nan_cost_still_writes_the_answer_and_its_usage_row(costed, user, price):
    costed.price = price
    costed.add("Fine.")
    chat = Chat.objects.create(model="costed:test", owner=user)

    assert chat.ask("Hi").content == "Fine."

    usage = Usage.objects.get(chat=chat)
    assert (usage.status, usage.cost) == ("succeeded", None)
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE


@pytest.mark.parametrize("price", [Decimal("1e20"), float("inf")], ids=["huge", "infinite"])
def test_an_absurd_cost_is_charged_as_the_most_a_row_holds(costed, user, price, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"tokens_per_day": 10**6}}
    costed.price = price
    costed.add("Fine.")
    chat = Chat.objects.create(model="costed:test", owner=user)

    chat.ask("Hi")

    assert Usage.objects.get(chat=chat).cost == MAX_COST
    assert spend_of(user).cost_per_day == MAX_COST  # the budget is spent, not credited


def test_an_absurd_cost_is_refused_by_a_cost_budget_before_the_call(costed, user):
    costed.price = Decimal("1e20")
    chat = Chat.objects.create(model="costed:test", owner=user)

    with pytest.raises(BudgetExceededError):
        chat.ask("Hi")  # its estimate is the most a row holds: no room under $1.00

    assert costed.requests == [] and not Usage.objects.filter(chat=chat).exists()


@pytest.mark.parametrize(
    ("reported", "counted"),
    [
        (12, 12),
        (None, 0),
        ("12", 12),
        (12.0, 12),
        (12.5, 13),
        (-1, 0),
        (float("nan"), 0),
        (float("-inf"), 0),
        (float("inf"), MAX_TOKENS),
        (2**40, MAX_TOKENS),
        ("twelve", 0),
        (True, 0),
        ({"tokens": 12}, 0),
    ],
)
def test_a_reported_token_count_is_read_safely(reported, counted):
    assert token_count(reported) == counted
    assert TokenUsage(output_tokens=reported).output_tokens == counted


def test_a_cost_is_read_safely():
    for price in (Decimal("NaN"), Decimal("sNaN"), float("nan"), -1, Decimal("-0.01"), "x", True):
        assert checked_cost(price) is None, price
    for price in (math.inf, Decimal("Infinity"), 10**30):
        assert checked_cost(price) == MAX_COST, price
    assert (checked_cost(None), checked_cost(0.25), checked_cost(0)) == (None, Decimal("0.25"), 0)


def test_a_warning_about_a_number_is_one_short_line(warnings_logged):
    token_count("x" * 10_000 + "\n" + "y", "input_tokens")

    (line,) = warning_lines(warnings_logged)
    assert "\n" not in line and len(line) < 120
