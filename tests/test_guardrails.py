"""Guardrails (docs/guardrails.md): input guardrails judge a user message before the model call
(or during it), output guardrails a final answer, tool guardrails a tool call before it runs;
each passes, blocks or replaces, and what it decided is kept on the message or the call.

Persisted chats run on SQLite and PostgreSQL (the suite's two runs); the in-memory chat runs
the same engine. The parallel guardrail against a real HTTP stream, the async verbs and the
admin are in tests/test_guardrails_parallel.py and tests/test_guardrails_admin.py; real
Celery workers in tests/test_guardrails_celery.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

import agentloop
from agentloop import signals
from agentloop.exceptions import ConfigurationError, GuardrailBlockedError, GuardrailError
from agentloop.guardrails import (
    PASS,
    Block,
    Guardrail,
    Replace,
    input_guardrail,
    load_guardrail,
    output_guardrail,
)
from agentloop.live_events import message_payload
from agentloop.models import Chat, ChatState, ToolCall, Usage
from agentloop.testing import ScriptedProvider, reply, tool_call
from agentloop.web import ui_messages
from tests import guardrail_checks as checks
from tests.helpers import transcript
from tests.tools import add, charge_card

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_checks():
    checks.forget()
    yield
    checks.RELEASE = None


@pytest.fixture
def chat(user, scripted):
    return Chat.objects.create(model="scripted:test", owner=user)


def runs(path: Path) -> list[str]:
    """The tools of tests/tools.py that ran (the ``run_log`` fixture's file)."""
    return path.read_text().split() if path.exists() else []


def outcomes(row) -> list[tuple[str, str, str]]:
    """(guardrail, stage, decision) of what a row keeps."""
    return [(o["guardrail"], o["stage"], o["decision"]) for o in row.guardrails]


# -- configuring -------------------------------------------------------------------------------
def test_a_persisted_chat_keeps_its_guardrails_by_import_path(chat):
    chat.with_guardrails(checks.no_secrets, checks.no_leaks, checks.NoShouting)

    chat.refresh_from_db()
    assert chat.guardrails == [
        "tests.guardrail_checks.no_secrets",
        "tests.guardrail_checks.no_leaks",
        "tests.guardrail_checks.NoShouting",
    ]
    loaded = Chat.objects.get(pk=chat.pk).conversation.store.config.get_guardrails()
    assert [(g.name, g.stage) for g in loaded] == [
        ("no_secrets", "input"),
        ("no_leaks", "output"),
        ("no_shouting", "output"),
    ]
    assert loaded[0] is checks.no_secrets


def test_a_guardrail_named_again_takes_its_place_and_replace_drops_the_others(chat):
    chat.with_guardrails(checks.no_secrets, checks.no_leaks)
    renamed = input_guardrail(checks.no_secrets.function, name="no_leaks")
    memory = agentloop.chat("scripted:test").with_guardrails(checks.no_secrets, checks.no_leaks)
    memory.with_guardrails(renamed)
    assert [g.stage for g in memory.store.config.get_guardrails()] == ["input", "input"]

    chat.with_guardrails(replace=True)
    chat.refresh_from_db()
    assert chat.guardrails == []


def test_what_is_not_a_guardrail_is_refused_with_a_clear_error(chat):
    with pytest.raises(ConfigurationError, match="decorate the function with @input_guardrail"):
        chat.with_guardrails(lambda context: PASS)

    @input_guardrail
    def local(context):
        return PASS

    with pytest.raises(ConfigurationError, match="input guardrail 'local' can't be stored"):
        chat.with_guardrails(local)
    chat.refresh_from_db()
    assert chat.guardrails == []  # nothing written
    agentloop.chat("scripted:test").with_guardrails(local)  # in memory, anything goes


def test_options_that_do_not_fit_a_stage_are_refused():
    with pytest.raises(ConfigurationError, match="only input guardrails run in parallel"):
        output_guardrail(run_in_parallel=True)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="'input', 'output' or 'tool'"):
        Guardrail(lambda context: PASS, stage="before")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text=... .input, output. or arguments=... .tool."):
        Replace()
    with pytest.raises(ConfigurationError, match="'tests.tools.add' is not a guardrail"):
        load_guardrail("tests.tools.add")


def test_a_guardrail_that_no_longer_imports_fails_the_step_naming_it(chat, scripted):
    Chat.objects.filter(pk=chat.pk).update(guardrails=["tests.guardrail_checks.gone"])
    chat = Chat.objects.get(pk=chat.pk)
    chat.ask_later("Hi")

    with pytest.raises(ConfigurationError, match="tests.guardrail_checks.gone"):
        chat.step()
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert "tests.guardrail_checks.gone" in chat.error
    assert scripted.requests == []  # fails closed: nothing was sent


# -- input guardrails --------------------------------------------------------------------------
def test_a_passing_input_guardrail_keeps_its_outcome_on_the_message(chat, scripted):
    chat.with_guardrails(checks.no_secrets)
    scripted.add("Hello!")

    answer = chat.ask("Hi there")

    assert answer.content == "Hello!"
    user_row = chat.messages.get(role="user")
    assert outcomes(user_row) == [("no_secrets", "input", "passed")]
    assert user_row.guardrails[0]["duration_ms"] >= 0
    assert checks.seen() == ["no_secrets:Hi there"]


def test_a_blocked_message_is_kept_marked_never_sent_and_the_chat_stops(chat, scripted):
    chat.with_guardrails(checks.no_secrets)
    stopped, blocked = [], []

    def on_stopped(sender, chat, reason, **kwargs):
        stopped.append(reason)

    def on_blocked(sender, chat, outcome, **kwargs):
        blocked.append(outcome)

    signals.chat_stopped.connect(on_stopped)
    signals.guardrail_blocked.connect(on_blocked)
    try:
        with pytest.raises(GuardrailBlockedError) as raised:
            chat.ask("my secret is 1234")
    finally:
        signals.chat_stopped.disconnect(on_stopped)
        signals.guardrail_blocked.disconnect(on_blocked)

    assert raised.value.reason == "guardrail no_secrets: the message mentions a secret"
    assert (raised.value.guardrail, raised.value.stage) == ("no_secrets", "input")
    assert scripted.requests == []  # never sent
    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (
        ChatState.STOPPED,
        "guardrail no_secrets: the message mentions a secret",
    )
    assert transcript(chat, "role", "content", "status") == [
        ("user", "my secret is 1234", "blocked")
    ]
    row = chat.messages.get()
    assert row.guardrails[0]["reason"] == "the message mentions a secret"
    assert list(chat.messages.blocked()) == [row]
    assert stopped == [chat.stop_reason]
    assert [(o.guardrail, o.stage, o.reason) for o in blocked] == [
        ("no_secrets", "input", "the message mentions a secret")
    ]
    assert chat.lease_token == ""


def test_after_a_blocked_message_the_next_one_goes_on_and_the_model_never_sees_it(chat, scripted):
    chat.with_guardrails(checks.no_secrets)
    with pytest.raises(GuardrailBlockedError):
        chat.ask("a secret")
    scripted.add("Sure.")

    assert chat.ask("What is 2 + 2?").content == "Sure."

    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (ChatState.IDLE, "")
    assert [(m.role, m.content) for m in scripted.requests[0].messages] == [
        ("user", "What is 2 + 2?")
    ]
    assert chat.step() is None  # nothing left to do: the blocked message is no move


def test_a_replacing_input_guardrail_changes_what_is_kept_and_sent(chat, scripted):
    chat.with_guardrails(checks.redact_cards)  # async def, run by a sync verb
    scripted.add("Noted.")

    chat.ask("charge 4242 4242 4242 4242 please")

    row = chat.messages.get(role="user")
    assert row.content == "charge [card] please"
    assert scripted.requests[0].messages[-1].content == "charge [card] please"
    assert row.guardrails == [
        {
            "guardrail": "redact_cards",
            "stage": "input",
            "decision": "replaced",
            "original": "charge 4242 4242 4242 4242 please",
            "duration_ms": row.guardrails[0]["duration_ms"],
        }
    ]


def test_a_redaction_keeps_no_copy_of_the_text_it_replaced(chat, scripted):
    chat.with_guardrails(checks.forget_cards)
    scripted.add("Noted.")

    chat.ask("my card is 4242 4242 4242 4242")

    row = chat.messages.get(role="user")
    assert row.content == "my card is [card]"
    assert "4242" not in str(row.guardrails)
    assert "original" not in row.guardrails[0]


def test_input_guardrails_run_in_order_each_on_the_text_the_one_before_left(chat, scripted):
    chat.with_guardrails(checks.redact_cards, checks.no_secrets)
    scripted.add("ok")

    chat.ask("4242 4242 4242 4242")

    assert checks.seen() == ["redact_cards:4242 4242 4242 4242", "no_secrets:[card]"]
    assert outcomes(chat.messages.get(role="user")) == [
        ("redact_cards", "input", "replaced"),
        ("no_secrets", "input", "passed"),
    ]


def test_a_message_is_judged_once_not_again_at_each_model_call_of_its_turn(chat, scripted):
    chat.with_guardrails(checks.no_secrets).with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}), "3")

    chat.ask("1 + 2?")

    assert checks.seen() == ["no_secrets:1 + 2?"]
    assert len(scripted.requests) == 2


def test_a_message_whose_model_call_failed_is_not_judged_again_when_resumed(chat, scripted):
    from agentloop.exceptions import AuthenticationError

    chat.with_guardrails(checks.no_secrets)
    scripted.add(AuthenticationError("bad key", status=401))
    with pytest.raises(AuthenticationError):
        chat.ask("Hi")
    scripted.add("Hello")

    chat.complete()

    assert checks.seen() == ["no_secrets:Hi"]
    assert outcomes(chat.messages.get(role="user")) == [("no_secrets", "input", "passed")]


def test_a_guardrail_that_raises_fails_closed_and_loses_nothing(chat, scripted):
    chat.with_guardrails(checks.explodes)

    with pytest.raises(GuardrailError, match="guardrail 'explodes' .input. raised RuntimeError: "
                                            "the moderation service is down"):  # fmt: skip
        chat.ask("boom")

    assert scripted.requests == []
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert chat.error == (
        "GuardrailError: guardrail 'explodes' (input) raised RuntimeError: the moderation "
        "service is down"
    )
    assert "RuntimeError" in chat.error_detail
    row = chat.messages.get()
    assert (row.content, row.status) == ("boom", "complete")  # kept as it was
    assert row.guardrails[0]["decision"] == "error"

    # Once it works again, resuming judges the message again and answers it.
    Chat.objects.filter(pk=chat.pk).update(guardrails=["tests.guardrail_checks.no_secrets"])
    chat = Chat.objects.get(pk=chat.pk)
    scripted.add("Recovered.")
    assert chat.complete().content == "Recovered."
    assert outcomes(chat.messages.get(role="user")) == [("no_secrets", "input", "passed")]


def test_a_guardrail_that_returns_no_decision_fails_closed(chat, scripted):
    chat.with_guardrails(checks.forgets_to_decide)

    with pytest.raises(GuardrailError, match="returned None, not a decision: return PASS"):
        chat.ask("Hi")

    assert scripted.requests == []
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED


# -- output guardrails -------------------------------------------------------------------------
def test_a_blocked_answer_is_kept_marked_and_the_chat_stops(chat, scripted):
    chat.with_guardrails(checks.no_leaks)
    scripted.add("the LEAK is here")

    with pytest.raises(GuardrailBlockedError, match="guardrail no_leaks: the answer leaks"):
        chat.ask("Tell me")

    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (
        ChatState.STOPPED,
        "guardrail no_leaks: the answer leaks internal data",
    )
    assert transcript(chat, "role", "content", "status") == [
        ("user", "Tell me", "complete"),
        ("assistant", "the LEAK is here", "blocked"),
    ]
    answer = chat.messages.get(role="assistant")
    assert outcomes(answer) == [("no_leaks", "output", "blocked")]
    assert Usage.objects.get(message=answer).status == "succeeded"  # the call did happen


def test_a_blocked_answer_is_never_sent_to_the_model_again(chat, scripted):
    chat.with_guardrails(checks.no_leaks)
    scripted.add("LEAK")
    with pytest.raises(GuardrailBlockedError):
        chat.ask("first")
    scripted.add("fine")

    chat.ask("second")

    assert [(m.role, m.content) for m in scripted.requests[1].messages] == [
        ("user", "first"),
        ("user", "second"),
    ]


def test_a_stopped_chat_resumed_asks_the_model_again(chat, scripted):
    chat.with_guardrails(checks.no_leaks)
    scripted.add("LEAK")
    with pytest.raises(GuardrailBlockedError):
        chat.ask("Tell me")
    scripted.add("a safe answer")

    assert chat.complete().content == "a safe answer"
    assert transcript(chat, "role", "status") == [
        ("user", "complete"),
        ("assistant", "blocked"),
        ("assistant", "complete"),
    ]


def test_a_replacing_output_guardrail_keeps_the_new_text_and_the_old_one_in_its_outcome(
    chat, scripted
):
    chat.with_guardrails(checks.polite)
    scripted.add("damn right")

    answer = chat.ask("Right?")

    assert answer.content == "darn right"
    row = chat.messages.get(role="assistant")
    assert (row.content, row.status) == ("darn right", "complete")
    assert row.guardrails[0]["original"] == "damn right"


def test_output_guardrails_skip_an_answer_with_no_text(chat, scripted):
    chat.with_guardrails(checks.no_leaks).with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}), "3")

    chat.ask("1 + 2?")

    assert checks.seen() == ["no_leaks:3"]
    assert chat.messages.filter(role="assistant").first().guardrails == []


def test_output_guardrails_judge_the_text_of_an_answer_that_calls_tools(chat, scripted, run_log):
    chat.with_guardrails(checks.no_launch_codes).with_tools(charge_card)
    scripted.add(reply("The SECRET launch code is 0000.", tool_call("charge_card", {"amount": 5})))

    with pytest.raises(GuardrailBlockedError, match="no_launch_codes: the answer gives a secret"):
        chat.ask("What is the code?")

    assert runs(run_log) == []  # the calls of a blocked answer never run
    answer = chat.messages.get(role="assistant")
    assert (answer.status, outcomes(answer)) == (
        "blocked",
        [("no_launch_codes", "output", "blocked")],
    )
    assert list(chat.tool_calls.values_list("state", flat=True)) == ["cancelled"]
    chat.refresh_from_db()
    assert (chat.state, chat.pending_approvals()) == (ChatState.STOPPED, [])
    # Nothing of it is shown: not its text, not its calls.
    assert "SECRET" not in json.dumps(ui_messages(chat))
    assert "charge_card" not in json.dumps(ui_messages(chat))
    payload = message_payload(answer)
    assert (payload["content"], payload["tool_calls"]) == ("", [])


def test_after_a_blocked_answer_that_called_tools_the_chat_goes_on(chat, scripted, run_log):
    chat.with_guardrails(checks.no_launch_codes).with_tools(charge_card)
    scripted.add(reply("The SECRET code.", tool_call("charge_card", {"amount": 5})))
    with pytest.raises(GuardrailBlockedError):
        chat.ask("What is the code?")
    scripted.add("I can't share that.")

    assert chat.ask("Then what?").content == "I can't share that."  # no call left pending

    assert [(m.role, m.content) for m in scripted.requests[-1].messages] == [
        ("user", "What is the code?"),
        ("user", "Then what?"),
    ]
    assert runs(run_log) == []


def test_a_replaced_text_of_an_answer_that_calls_tools_keeps_its_calls(chat, scripted):
    chat.with_guardrails(checks.hide_codes).with_tools(add)
    scripted.add(reply("Code 1234: adding.", tool_call("add", {"a": 1, "b": 2})), "3")

    assert chat.ask("Add them").content == "3"

    asking = chat.messages.filter(role="assistant").first()
    assert (asking.content, asking.status) == ("Code [code]: adding.", "complete")
    assert asking.guardrails[0]["original"] == "Code 1234: adding."
    assert transcript(chat, "role", "content")[2] == ("tool", "3")  # the call ran


def test_a_streamed_answer_that_is_blocked_leaves_one_blocked_row(chat, scripted):
    from agentloop.testing import stream

    chat.with_guardrails(checks.no_leaks)
    scripted.add(stream("the ", "LEAK"))
    chunks = []

    with pytest.raises(GuardrailBlockedError):
        chat.ask("Tell me", stream=chunks.append)

    assert transcript(chat, "role", "content", "status") == [
        ("user", "Tell me", "complete"),
        ("assistant", "the LEAK", "blocked"),
    ]


def test_an_output_guardrail_that_raises_keeps_the_answer_marked_and_fails_the_chat(chat, scripted):
    chat.with_guardrails(checks.explodes_on_answers)
    scripted.add("boom")

    with pytest.raises(GuardrailError, match="raised ValueError: the classifier timed out"):
        chat.ask("Hi")

    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    answer = chat.messages.get(role="assistant")
    assert (answer.content, answer.status) == ("boom", "blocked")  # kept, never shown as one
    assert outcomes(answer) == [("explodes_on_answers", "output", "error")]


def test_a_guardrail_subclass_works_like_a_decorated_function(chat, scripted):
    chat.with_guardrails(checks.NoShouting)
    scripted.add("I AM SHOUTING")

    with pytest.raises(GuardrailBlockedError, match="guardrail no_shouting: the answer shouts"):
        Chat.objects.get(pk=chat.pk).ask("Hi")


# -- tool guardrails ---------------------------------------------------------------------------
def test_a_blocked_tool_call_is_not_run_and_the_model_is_told_why(chat, scripted, run_log):
    chat.with_guardrails(checks.cap_charges).with_tools(charge_card)
    scripted.add(tool_call("charge_card", {"amount": 90}, id="c1"), "I could not charge it.")

    answer = chat.ask("Charge 90")

    assert answer.content == "I could not charge it."
    assert runs(run_log) == []
    assert transcript(chat, "role", "content", "is_error")[2] == (
        "tool",
        "Blocked by guardrail cap_charges: charges over 40 need a person; the tool was not run.",
        True,
    )
    call = ToolCall.objects.get(chat=chat)
    assert call.state == "failed"
    assert outcomes(call) == [("cap_charges", "tool", "blocked")]
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE  # the turn went on


def test_a_passing_tool_guardrail_lets_the_call_run_and_keeps_its_outcome(chat, scripted, run_log):
    chat.with_guardrails(checks.cap_charges).with_tools(charge_card, add)
    scripted.add(
        [tool_call("charge_card", {"amount": 20}), tool_call("add", {"a": 1, "b": 1})], "done"
    )

    chat.ask("Charge 20")

    assert runs(run_log) == ["charge_card"]
    by_name = {call.name: call for call in ToolCall.objects.filter(chat=chat)}
    assert outcomes(by_name["charge_card"]) == [("cap_charges", "tool", "passed")]
    assert by_name["add"].guardrails == []  # cap_charges names other tools
    assert checks.seen() == ['cap_charges:{"amount": 20}']


def test_a_tool_guardrail_that_stops_ends_the_round_and_stops_the_chat(chat, scripted, run_log):
    chat.with_guardrails(checks.stop_charges).with_tools(charge_card, add)
    scripted.add(
        [
            tool_call("charge_card", {"amount": 5}, id="c1"),
            tool_call("add", {"a": 1, "b": 1}, id="c2"),
        ]
    )

    with pytest.raises(
        GuardrailBlockedError, match="guardrail stop_charges: charging is switched off"
    ):
        chat.ask("Charge and add")

    assert runs(run_log) == []
    assert transcript(chat, "role", "content", "call_id")[2:] == [
        (
            "tool",
            "Blocked by guardrail stop_charges: charging is switched off; the tool was not run.",
            "c1",
        ),
        (
            "tool",
            "Not run: guardrail stop_charges: charging is switched off stopped the chat.",
            "c2",
        ),
    ]
    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (
        ChatState.STOPPED,
        "guardrail stop_charges: charging is switched off",
    )
    assert len(scripted.requests) == 1  # no model call after the round
    scripted.add("ok")
    assert chat.ask("never mind").content == "ok"  # the next message goes on


def test_a_tool_guardrail_can_replace_the_arguments_the_tool_runs_with(chat, scripted):
    chat.with_guardrails(checks.tenfold).with_tools(add)
    scripted.add(tool_call("add", {"a": 2, "b": 3}), "23")

    chat.ask("2 + 3?")

    assert transcript(chat, "role", "content")[2] == ("tool", "23")
    call = ToolCall.objects.get(chat=chat)
    assert call.arguments == {"a": 20, "b": 3}
    assert call.guardrails[0]["original"] == {"a": 2, "b": 3}
    assert call.original_arguments is None  # that is an approver's edit


def test_arguments_a_tool_refuses_from_a_guardrail_fail_closed(chat, scripted):
    chat.with_guardrails(checks.breaks_arguments).with_tools(add)
    scripted.add(tool_call("add", {"a": 2, "b": 3}))

    with pytest.raises(GuardrailError, match="replaced the arguments of 'add' with ones its tool"):
        chat.ask("2 + 3?")

    call = ToolCall.objects.get(chat=chat)
    assert (call.state, call.arguments) == ("pending", {"a": 2, "b": 3})  # not run
    assert outcomes(call) == [("breaks_arguments", "tool", "error")]
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED


def test_tool_guardrails_judge_calls_run_at_once_too(chat, scripted, run_log):
    chat.with_guardrails(checks.cap_charges).with_tools(charge_card)
    chat.with_tool_options(concurrency="threads")
    scripted.add(
        [tool_call("charge_card", {"amount": 90}), tool_call("charge_card", {"amount": 10})], "ok"
    )

    chat.ask("two charges")

    assert runs(run_log) == ["charge_card"]
    states = sorted(call.state for call in ToolCall.objects.filter(chat=chat))
    assert states == ["failed", "succeeded"]


# -- the in-memory chat, async verbs, agents ---------------------------------------------------
def test_an_in_memory_chat_takes_any_guardrail_and_keeps_outcomes_on_its_messages():
    provider = ScriptedProvider("fine")
    agentloop.providers.register("guarded", provider)
    try:

        @input_guardrail
        def once(context):
            return PASS

        memory = agentloop.chat("guarded:test").with_guardrails(once)
        memory.ask("Hi")
        assert [o.decision for o in memory.messages[0].guardrails] == ["passed"]

        memory.with_guardrails(input_guardrail(lambda c: Block("no"), name="never"))
        with pytest.raises(GuardrailBlockedError, match="guardrail never: no"):
            memory.ask("again")
        assert memory.messages[-1].status == "blocked"
    finally:
        agentloop.providers.unregister("guarded")


def test_async_verbs_run_sync_and_async_guardrails(chat, scripted):
    chat.with_guardrails(checks.no_secrets, checks.redact_cards, checks.no_leaks)
    scripted.add("fine", "LEAK")

    # From the test's thread: the verb's database phases see the test's transaction.
    answer = async_to_sync(chat.aask)("card 4242 4242 4242 4242")
    assert answer.content == "fine"
    assert scripted.requests[0].messages[-1].content == "card [card]"

    with pytest.raises(GuardrailBlockedError, match="no_leaks"):
        async_to_sync(chat.aask)("more")
    with pytest.raises(GuardrailBlockedError, match="no_secrets"):
        async_to_sync(chat.aask)("a secret")


def test_an_agent_declares_guardrails_its_chats_run(user, scripted):
    from tests.agents import GuardedAgent

    scripted.add("LEAK")
    chat = GuardedAgent.create(owner=user)
    assert chat.guardrails == [
        "tests.guardrail_checks.no_secrets",
        "tests.guardrail_checks.no_leaks",
    ]

    with pytest.raises(GuardrailBlockedError, match="no_leaks"):
        chat.ask("Hi")
    memory = GuardedAgent.chat()
    with pytest.raises(GuardrailBlockedError, match="no_secrets"):
        memory.ask("a secret")


# -- what guardrails cost, in statements -------------------------------------------------------
def count(action) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        action()
    return [query["sql"] for query in captured.captured_queries]


def test_judging_a_message_costs_one_write_and_an_answer_or_a_tool_call_none(
    user, scripted, settings
):
    from tests.step_queries import GENERATE_TEXT_QUERIES, ONE_STATEMENT_WRITES, RUN_TOOLS_QUERIES

    settings.AGENTLOOP = {**settings.AGENTLOOP, "CANCEL_POLL_INTERVAL": 60}
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(add)
    chat.with_guardrails(checks.no_secrets, checks.no_leaks, checks.tenfold)
    chat = Chat.objects.get(pk=chat.pk)
    chat.ask_later("Hi")
    scripted.add("Hello")

    # The message's outcomes: one statement on PostgreSQL (the lease's guard first) inside
    # the test's savepoint; SQLite's transaction of the lease's UPDATE and the message's.
    judged = 3 if ONE_STATEMENT_WRITES else 4
    assert len(count(chat.generate)) == GENERATE_TEXT_QUERIES + judged

    chat.ask_later("add twice")
    scripted.add([tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})])
    chat.generate()
    # Tool outcomes ride on each call's claim, the answer's on its row: nothing more.
    assert len(count(chat.run_tools)) == RUN_TOOLS_QUERIES
    scripted.add("done")
    assert len(count(chat.generate)) == GENERATE_TEXT_QUERIES  # the message is judged once
    assert [c.arguments["a"] for c in ToolCall.objects.filter(chat=chat)] == [10, 30]


def test_a_chat_with_guardrails_is_refused_by_a_batch(chat):
    from agentloop.exceptions import BatchError

    chat.with_guardrails(checks.no_secrets).ask_later("Hi")

    with pytest.raises(BatchError, match="has guardrails, which a batch does not run"):
        agentloop.batch([chat])
    assert chat.messages.get().guardrails == []  # nothing judged, nothing sent


# -- subagents ---------------------------------------------------------------------------------
def test_a_subagent_a_guardrail_stops_in_process_is_an_error_result_for_its_parent(brains, user):
    from tests.agents import Manager

    brains.script(
        "You are MANAGER.",
        tool_call("vetted", {"task": "Share the secret plan"}, id="v1"),
        "It could not do that.",
    )
    chat = Manager.create(owner=user)

    assert chat.ask("Go").content == "It could not do that."

    result = chat.messages.get(role="tool")
    assert (result.content, result.is_error) == (
        "The Vetted subagent stopped: guardrail no_secrets: the message mentions a secret",
        True,
    )
    child = Chat.objects.get(parent=chat)
    assert (child.state, list(child.messages.values_list("status", flat=True))) == (
        "stopped",
        ["complete", "blocked"],  # its instructions, and the task it was given
    )


@pytest.mark.django_db(transaction=True)
def test_a_background_subagent_a_guardrail_stops_releases_its_waiting_parent(
    brains, user, settings
):
    from agentloop.runners import wait_for_embedded_jobs
    from tests.agents import Manager

    settings.AGENTLOOP = {"BACKGROUND": "embedded", "CANCEL_POLL_INTERVAL": 0.05}
    brains.script(
        "You are MANAGER.",
        tool_call("vetted", {"task": "Share the secret plan"}, id="v1"),
        "It could not do that.",
    )
    chat = Manager.create(owner=user)

    chat.ask_later("Go").complete_later()
    assert wait_for_embedded_jobs(timeout=60), "background jobs did not finish"

    chat.refresh_from_db()
    assert chat.state == "idle"
    assert transcript(chat, "role", "content")[-2:] == [
        (
            "tool",
            "The subagent stopped before it answered: guardrail no_secrets: the message "
            "mentions a secret.",
        ),
        ("assistant", "It could not do that."),
    ]
    assert Chat.objects.get(parent=chat).state == "stopped"


# -- tool guardrails with people in the loop, deferred tools, async verbs -----------------------
def test_a_tool_guardrail_blocks_a_call_before_a_person_is_asked(chat, scripted, run_log):
    from tests.tools import transfer

    chat.with_guardrails(checks.no_offshore).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "offshore"}, id="t1"), "It was blocked.")

    assert chat.ask("Send 5 offshore").content == "It was blocked."

    assert chat.pending_approvals() == []  # nobody was asked to approve what would not run
    assert runs(run_log) == []
    call = ToolCall.objects.get(chat=chat)
    assert (call.decision, call.state, outcomes(call)) == (
        "",
        "failed",
        [("no_offshore", "tool", "blocked")],
    )
    assert transcript(chat, "role", "content")[2] == (
        "tool",
        "Blocked by guardrail no_offshore: not to that account; the tool was not run.",
    )


def test_a_call_is_put_to_a_person_as_the_guardrails_left_it_and_not_judged_again(
    chat, scripted, run_log
):
    from tests.tools import transfer

    chat.with_guardrails(checks.round_down).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 57, "to": "bob"}, id="t1"), "Done.")
    chat.ask("Send 57 to bob")

    (held,) = chat.pending_approvals()
    assert held.arguments == {"amount": 50, "to": "bob"}  # what the person approves runs
    row = ToolCall.objects.get(chat=chat)
    assert (row.state, outcomes(row)) == ("waiting", [("round_down", "tool", "replaced")])
    assert row.guardrails[0]["original"] == {"amount": 57, "to": "bob"}

    chat.approve("t1")
    assert Chat.objects.get(pk=chat.pk).complete().content == "Done."

    assert runs(run_log) == ["transfer"]
    assert transcript(chat, "role", "content")[2] == ("tool", "sent 50 to bob")
    assert len(checks.seen()) == 1  # judged once, before the person was asked
    assert outcomes(ToolCall.objects.get(chat=chat)) == [("round_down", "tool", "replaced")]


def test_arguments_an_approver_edited_are_judged_again(chat, scripted, run_log):
    from tests.tools import transfer

    chat.with_guardrails(checks.no_offshore).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"), "It was blocked.")
    chat.ask("Send 5 to bob")
    assert outcomes(ToolCall.objects.get(chat=chat)) == [("no_offshore", "tool", "passed")]

    chat.approve("t1", arguments={"amount": 5, "to": "offshore"})
    assert Chat.objects.get(pk=chat.pk).complete().content == "It was blocked."

    assert runs(run_log) == []
    call = ToolCall.objects.get(chat=chat)
    assert (call.decision, call.state, outcomes(call)) == (
        "approved",
        "failed",
        [("no_offshore", "tool", "passed"), ("no_offshore", "tool", "blocked")],
    )


def test_an_in_memory_chat_judges_a_call_before_a_person_is_asked(scripted, run_log):
    from tests.tools import transfer

    memory = agentloop.chat("scripted:test").with_tools(transfer)
    memory.with_guardrails(checks.round_down, checks.no_offshore)
    scripted.add(
        tool_call("transfer", {"amount": 5, "to": "offshore"}, id="t0"),
        tool_call("transfer", {"amount": 57, "to": "bob"}, id="t1"),
        "Sent.",
    )
    memory.ask("Send 5 offshore")  # blocked: the model hears why and asks for another

    (held,) = memory.pending_approvals()
    assert (held.id, held.arguments) == ("t1", {"amount": 50, "to": "bob"})
    memory.approve("t1")
    assert memory.complete().content == "Sent."
    assert runs(run_log) == ["transfer"]
    assert [entry.split(":")[0] for entry in checks.seen()] == ["round_down", "round_down"]


def test_a_deferred_call_is_judged_before_it_is_handed_out(chat, scripted):
    from tests.control_tools import ask_accounting

    chat.with_guardrails(checks.no_offshore).with_tools(ask_accounting)
    scripted.add(
        [
            tool_call("ask_accounting", {"invoice": "INV-0"}, id="d0"),
            tool_call("ask_accounting", {"invoice": "INV-7"}, id="d7"),
        ]
    )

    chat.ask("Ask about both invoices")

    calls = {call.call_id: call for call in ToolCall.objects.filter(chat=chat)}
    assert (calls["d0"].state, outcomes(calls["d0"])) == (
        "failed",
        [("no_offshore", "tool", "blocked")],
    )
    assert (calls["d7"].state, calls["d7"].wait_reason, outcomes(calls["d7"])) == (
        "waiting",
        "deferred",
        [("no_offshore", "tool", "passed")],
    )


def test_async_verbs_run_tool_guardrails_too(chat, scripted, run_log):
    chat.with_guardrails(checks.cap_charges, checks.tenfold).with_tools(charge_card, add)
    scripted.add(
        [tool_call("charge_card", {"amount": 90}), tool_call("add", {"a": 2, "b": 3})], "ok"
    )

    async_to_sync(chat.aask)("charge and add")

    assert runs(run_log) == []
    assert [m.content for m in chat.messages.filter(role="tool").order_by("id")] == [
        "Blocked by guardrail cap_charges: charges over 40 need a person; the tool was not run.",
        "23",
    ]
