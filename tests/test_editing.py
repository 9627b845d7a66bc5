"""Editing a conversation (docs/editing.md): ``regenerate()``, ``edit()``, ``fork()`` and their
``_later`` and async forms, on an in-memory chat and a persisted one.

What each verb does to the rows (superseded, kept, never sent again), to the usage ledger,
to pending tool calls, approvals, questions, deferred calls and subagents, and when it
refuses. What providers receive is asserted on the requests the test model records.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

import agentloop
from agentloop import ChatBusyError, EditError
from agentloop.engine import Conversation
from agentloop.engine.compaction import SUMMARY_INSTRUCTIONS
from agentloop.exceptions import (
    DecisionConflictError,
    GuardrailBlockedError,
    ToolCallNotWaitingError,
)
from agentloop.messages import ModelRequest, TokenUsage, ToolCallState
from agentloop.models import Batch, BatchItem, Chat, ChatState, ToolCall, Usage
from agentloop.signals import chat_forked, messages_superseded
from agentloop.testing import FunctionProvider, reply, tool_call
from agentloop.web import ui_messages
from tests.agents import Lead
from tests.control_tools import ask_accounting
from tests.editing_agents import no_passwords
from tests.tools import add, ask_manager, transfer

#: a one-pixel PNG, as a data URL.
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


@pytest.fixture(params=["memory", pytest.param("persisted", marks=pytest.mark.django_db)])
def new_chat(request: pytest.FixtureRequest, scripted: Any) -> Any:
    """A chat on the scripted model: in memory, or persisted (owned by ``user``)."""
    if request.param == "memory":
        return agentloop.chat("scripted:test")
    return Chat.objects.create(model="scripted:test", owner=request.getfixturevalue("user"))


def current(chat: Any) -> list[tuple[str, str]]:
    """The chat's current messages (no superseded ones), instructions aside."""
    rows = chat.messages if isinstance(chat, Conversation) else chat.messages.current()
    return [(m.role, m.content) for m in rows if m.role != "system"]


def history(chat: Any) -> list[tuple[str, str, bool]]:
    """Every message, superseded ones included, with whether it is superseded."""
    if isinstance(chat, Conversation):
        return [(m.role, m.content, m.superseded) for m in chat.store.edits.load_history()]
    return [(m.role, m.content, m.superseded_at is not None) for m in chat.messages.order_by("id")]


def sent(request: ModelRequest) -> list[tuple[str, str]]:
    """What a request sent, instructions aside."""
    return [(m.role, m.content) for m in request.messages if m.role != "system"]


# -- regenerate --------------------------------------------------------------------------------
def test_regenerate_answers_the_last_message_again_and_keeps_the_old_answer(new_chat, scripted):
    scripted.add("First answer.", "Second answer.")
    new_chat.ask("Hi")

    answer = new_chat.regenerate()

    assert answer.content == "Second answer."
    assert current(new_chat) == [("user", "Hi"), ("assistant", "Second answer.")]
    assert history(new_chat) == [
        ("user", "Hi", True),
        ("assistant", "First answer.", True),
        ("user", "Hi", False),
        ("assistant", "Second answer.", False),
    ]


def test_no_request_ever_sends_a_superseded_row(new_chat, scripted):
    scripted.add("Hello.", "Tomorrow.", "Sunny tomorrow.", "Hello again.", "Fine.")
    first = new_chat.ask("Hi")
    new_chat.ask("Weather?")
    new_chat.regenerate()
    hi = next(m for m in (new_chat.messages if isinstance(new_chat, Conversation)
                          else new_chat.messages.current()) if m.role == "user")  # fmt: skip

    new_chat.edit(hi, "Hi there")
    new_chat.ask("How are you?")  # a verb of its own: the transcript read afresh

    assert first.content == "Hello."
    assert [sent(request) for request in scripted.requests[2:]] == [
        [("user", "Hi"), ("assistant", "Hello."), ("user", "Weather?")],  # the regenerate
        [("user", "Hi there")],  # the edit: everything after it is gone from requests
        [("user", "Hi there"), ("assistant", "Hello again."), ("user", "How are you?")],
    ]


def test_a_regenerated_turn_is_a_new_turn_for_the_limits(new_chat, scripted):
    scripted.add("One.", "Two.")
    new_chat.with_limits(max_model_calls=1)
    new_chat.ask("Hi")

    assert new_chat.regenerate().content == "Two."  # not stopped: the limit counts anew


def test_regenerate_with_no_user_message_is_refused_and_writes_nothing(new_chat, scripted):
    with pytest.raises(EditError, match="no user message"):
        new_chat.regenerate()

    assert history(new_chat) == []
    scripted.assert_complete()


@pytest.mark.django_db
def test_a_refused_edit_leaves_the_chat_as_it_was(chat, scripted):
    scripted.add("Hello.")
    chat.ask("Hi")
    answer = chat.messages.get(role="assistant")

    with pytest.raises(EditError, match="only a user message can be edited"):
        chat.edit(answer, "Changed")

    chat.refresh_from_db()
    assert (chat.state, chat.error, chat.lease_token, chat.edited_at) == ("idle", "", "", None)
    assert not chat.messages.superseded().exists()


# -- edit ----------------------------------------------------------------------------------------
def test_edit_replaces_a_user_message_and_reruns_from_it(new_chat, scripted):
    scripted.add("A1.", "B1.", "A2.")
    new_chat.ask("A")
    new_chat.ask("B")
    a = next(m for m in (new_chat.messages if isinstance(new_chat, Conversation)
                         else new_chat.messages.current()) if m.content == "A")  # fmt: skip

    answer = new_chat.edit(a, "A, edited")

    assert answer.content == "A2."
    assert current(new_chat) == [("user", "A, edited"), ("assistant", "A2.")]
    assert [superseded for _, _, superseded in history(new_chat)] == [True] * 4 + [False] * 2


def test_an_edit_keeps_the_attachments_unless_given_others(new_chat, scripted):
    scripted.add("A picture.", "Still a picture.", "No picture.")
    new_chat.ask("Look", attachments=PNG)
    message = _users(new_chat)[-1]

    new_chat.edit(message, "Look again")
    kept = scripted.requests[-1].messages[-1]
    new_chat.edit(_users(new_chat)[-1], "Words only", attachments=None)
    dropped = scripted.requests[-1].messages[-1]

    assert (kept.content, len(kept.attachments)) == ("Look again", 1)
    assert (dropped.content, dropped.attachments) == ("Words only", [])


def test_only_a_current_user_message_of_this_chat_can_be_edited(new_chat, scripted):
    scripted.add("Hello.", "Hello!")
    new_chat.ask("Hi")
    old_user = _users(new_chat)[-1]
    new_chat.regenerate()

    with pytest.raises(EditError, match="was superseded"):
        new_chat.edit(old_user, "Again")
    with pytest.raises(EditError, match="No message"):
        new_chat.edit(987654, "Again")
    with pytest.raises(EditError, match="must be a string"):
        new_chat.edit(_users(new_chat)[-1], None)
    with pytest.raises(EditError, match="needs some text"):
        new_chat.edit(_users(new_chat)[-1], "   ")

    assert current(new_chat) == [("user", "Hi"), ("assistant", "Hello!")]
    scripted.assert_complete()


@pytest.mark.django_db
def test_the_later_forms_write_the_new_turn_and_complete_answers_it(chat, scripted):
    scripted.add("Hello.")
    chat.ask("Hi")

    assert chat.edit_later(_users(chat)[0], "Hi there") is chat
    assert len(scripted.requests) == 1  # no model call yet
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE and chat.edited_at is not None
    assert current(chat) == [("user", "Hi there")]

    scripted.add("Hello there.")
    assert chat.complete().content == "Hello there."
    assert chat.regenerate_later() is chat
    assert current(chat) == [("user", "Hi there")]


def _users(chat: Any) -> list[Any]:
    if isinstance(chat, Conversation):
        return [m for m in chat.messages if m.role == "user"]
    return list(chat.messages.current().filter(role="user").order_by("id"))


# -- busy chats --------------------------------------------------------------------------------
@pytest.mark.django_db
def test_an_edit_while_another_process_holds_the_chat_is_refused(chat, scripted):
    scripted.add("Hello.")
    chat.ask("Hi")
    rival = Chat.objects.get(pk=chat.pk).conversation.store
    assert rival.runs.claim() is True  # another process runs a verb of this chat

    with pytest.raises(ChatBusyError):
        chat.regenerate()

    rival.runs.release("done")
    assert not chat.messages.superseded().exists()
    scripted.assert_complete()


@pytest.mark.django_db
@pytest.mark.parametrize("state", [ChatState.QUEUED, ChatState.RUNNING])
def test_an_edit_while_a_background_run_is_in_progress_is_refused(chat, scripted, state):
    scripted.add("Hello.")
    chat.ask("Hi")
    Chat.objects.filter(pk=chat.pk).update(state=state)  # between two jobs: no lease held

    with pytest.raises(ChatBusyError, match=f"run in progress \\({state}\\)"):
        Chat.objects.get(pk=chat.pk).edit_later(_users(chat)[0], "Hi there")

    chat.refresh_from_db()
    assert chat.state == state and chat.error == ""
    assert not chat.messages.superseded().exists()


@pytest.mark.django_db
def test_an_edit_while_an_answer_waits_in_a_provider_batch_is_refused(chat, scripted):
    scripted.add("Hello.")
    chat.ask("Hi")
    batch = Batch.objects.create(provider="scripted", model="test")
    BatchItem.objects.create(batch=batch, chat=chat, custom_id="c-1", model="test")

    with pytest.raises(ChatBusyError, match="provider batch"):
        chat.regenerate_later()


# -- pending tool calls, people, subagents ------------------------------------------------------
@pytest.mark.django_db
def test_a_call_waiting_for_approval_is_superseded_and_never_runs(chat, scripted, run_log, user):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"), "I won't pay.")
    chat.ask("Pay Bob")
    assert chat.is_waiting()

    assert chat.regenerate().content == "I won't pay."

    row = ToolCall.objects.get(call_id="t1")
    assert (row.state, row.decision) == (ToolCallState.CANCELLED, "superseded")
    assert chat.pending_approvals() == []
    with pytest.raises(ToolCallNotWaitingError, match="superseded"):
        chat.approve(row.pk, by=user)
    assert chat.complete().content == "I won't pay."  # nothing left to run
    assert not run_log.exists()


@pytest.mark.django_db
def test_a_question_and_a_deferred_call_superseded_take_no_answer(chat, scripted, user):
    chat.with_tools(ask_manager, ask_accounting)
    scripted.add(
        reply(
            "",
            tool_call("ask_manager", {"question": "Which?"}, id="q1"),
            tool_call("ask_accounting", {"invoice": "INV-7"}, id="d1"),
        ),
        "Let us start over.",
    )
    chat.ask("Check the invoice")
    assert chat.pending_questions() and chat.pending_results()

    chat.edit(_users(chat)[0], "Never mind the invoice")

    with pytest.raises(ToolCallNotWaitingError, match="superseded"):
        chat.answer("q1", "The blue one", by=user)
    with pytest.raises(ToolCallNotWaitingError, match="superseded"):
        chat.submit_result("d1", "paid")
    states = dict(ToolCall.objects.values_list("call_id", "state"))
    assert states == {"q1": ToolCallState.CANCELLED, "d1": ToolCallState.CANCELLED}


@pytest.mark.django_db
def test_calls_not_run_yet_are_superseded_and_never_run(chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="c1"), "Three.")
    chat.ask_later("Add")
    chat.generate()  # the answer asks for add; nothing ran yet

    assert chat.regenerate().content == "Three."
    assert ToolCall.objects.get(call_id="c1").state == ToolCallState.CANCELLED
    assert not chat.messages.filter(role="tool").exists()


@pytest.mark.django_db
def test_a_new_answer_never_reuses_the_id_of_a_superseded_call(chat, scripted):
    """Some servers number their calls per answer: the id (a tool's idempotency key) is
    made unique across the superseded rows too."""
    chat.with_tools(add)
    scripted.add(
        tool_call("add", {"a": 1, "b": 2}, id="call_0"), "3",
        tool_call("add", {"a": 1, "b": 2}, id="call_0"), "Still 3",
    )  # fmt: skip
    chat.ask("Add")

    assert chat.regenerate().content == "Still 3"

    ids = list(ToolCall.objects.filter(chat=chat).order_by("id").values_list("call_id", flat=True))
    assert ids[0] == "call_0" and ids[1].startswith("call_0_") and len(set(ids)) == 2
    assert scripted.requests[-1].messages[-1].tool_call_id == ids[1]


@pytest.mark.django_db
def test_the_subagent_of_a_superseded_call_is_cancelled(brains, user, run_log):
    brains.script("You are LEAD.", tool_call("payer", {"task": "Pay Bob 5"}, id="c1"))
    brains.script("You are PAYER.", tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    lead = Lead.create(owner=user)
    lead.ask("Pay Bob")
    child = Chat.objects.get(parent=lead)
    assert child.is_waiting() and lead.pending_approvals()

    brains.script("You are LEAD.", "Paying nobody.")
    assert lead.regenerate().content == "Paying nobody."

    child.refresh_from_db()
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.CANCELLED
    assert child.state == ChatState.IDLE and not child.is_waiting()
    assert lead.pending_approvals() == []
    with pytest.raises(DecisionConflictError):
        child.approve("t1", by=user)
    assert ToolCall.objects.get(call_id="c1").decision == "superseded"
    assert not run_log.exists()
    brains.assert_complete()


# -- the ledger, compaction, listings ----------------------------------------------------------
@pytest.mark.django_db
def test_usage_of_superseded_answers_stays_charged_to_the_owner(chat, scripted, user):
    scripted.add("One.", "Two.", "Three.")
    chat.ask("Hi")
    chat.regenerate()
    chat.regenerate()

    assert Usage.objects.for_owner(user).filter(chat=chat).count() == 3
    superseded = chat.messages.superseded().filter(role="assistant")
    assert Usage.objects.filter(message__in=superseded).count() == 2


def is_summary(request: ModelRequest) -> bool:
    return bool(request.messages) and request.messages[0].content == SUMMARY_INSTRUCTIONS


def test_compaction_never_summarises_superseded_rows(new_chat):
    def answer(request: ModelRequest) -> Any:
        usage = TokenUsage(input_tokens=1, output_tokens=1)
        if is_summary(request):
            return reply("They talked.", usage=usage)
        if len([r for r in model.requests if not is_summary(r)]) == 1:
            return reply("SUPERSEDED " * 30, usage=usage)  # the answer regenerate replaces
        return reply("kept " * 30, usage=usage)

    model = FunctionProvider(answer)
    agentloop.providers.register("scripted", model)
    new_chat.with_context_window(100).with_compaction(at=0.5, keep_recent=1)
    new_chat.ask("Q1")
    new_chat.regenerate()

    new_chat.ask("Q2 " + "x" * 100)

    (summary_request,) = [r for r in model.requests if is_summary(r)]
    summarised = summary_request.messages[1].content
    assert "kept" in summarised and "SUPERSEDED" not in summarised
    assert all("SUPERSEDED" not in m.content for m in model.requests[-1].messages)


@pytest.mark.django_db
def test_ui_messages_leave_out_superseded_rows_unless_asked(chat, scripted):
    scripted.add("Old.", "New.")
    chat.ask("Hi")
    chat.regenerate()

    shown = ui_messages(chat)
    everything = ui_messages(chat, include_superseded=True)

    assert [part["text"] for m in shown for part in m["parts"] if part["type"] == "text"] == [
        "Hi",
        "New.",
    ]
    assert [m.get("metadata", {}).get("superseded", False) for m in everything] == [
        True,
        True,
        False,
        False,
    ]


# -- fork ----------------------------------------------------------------------------------------
def test_a_fork_goes_its_own_way_from_the_message_it_was_forked_at(new_chat, scripted):
    scripted.add("Hello.", "Tea.", "Coffee.")
    new_chat.ask("Hi")
    hello = [m for m in _all_current(new_chat) if m.role == "assistant"][0]
    new_chat.ask("Tea or coffee?")

    forked = new_chat.fork(at=hello)
    answer = forked.ask("Which coffee?")

    assert answer.content == "Coffee."
    assert sent(scripted.requests[-1]) == [
        ("user", "Hi"),
        ("assistant", "Hello."),
        ("user", "Which coffee?"),
    ]
    assert current(new_chat)[-1] == ("assistant", "Tea.")  # the origin as it was
    assert current(forked) == [
        ("user", "Hi"),
        ("assistant", "Hello."),
        ("user", "Which coffee?"),
        ("assistant", "Coffee."),
    ]


def _all_current(chat: Any) -> list[Any]:
    return chat.messages if isinstance(chat, Conversation) else list(chat.messages.current())


@pytest.mark.django_db
def test_a_persisted_fork_is_linked_and_starts_with_no_usage(chat, scripted, user):
    chat.with_tools(add).with_temperature(0.2)
    scripted.add("Hello.")
    chat.ask("Hi")
    forks: list[Any] = []
    chat_forked.connect(lambda sender, **kw: forks.append(kw), weak=False, dispatch_uid="t-fork")
    try:
        forked = chat.fork()
    finally:
        chat_forked.disconnect(dispatch_uid="t-fork")

    at = chat.messages.get(role="assistant")
    assert isinstance(forked, Chat) and forked.pk != chat.pk
    assert (forked.forked_from, forked.forked_from_message, forked.owner) == (chat, at, user)
    assert (forked.temperature, forked.tools, forked.state) == (0.2, chat.tools, ChatState.IDLE)
    assert not Usage.objects.filter(chat=forked).exists()
    assert forks == [{"chat": chat, "fork": forked, "message": at, "signal": chat_forked}]
    assert list(chat.forks.all()) == [forked]


@pytest.mark.django_db
def test_a_fork_at_an_open_round_never_runs_its_calls(chat, scripted, run_log):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat.ask("Pay Bob")  # waits for approval

    forked = chat.fork()

    assert [(m.role, m.is_error) for m in forked.messages.order_by("id")][-1] == ("tool", True)
    assert forked.pending_approvals() == [] and chat.pending_approvals()
    scripted.add("Not paid.")
    assert forked.complete().content == "Not paid."
    assert not run_log.exists()


def test_a_fork_of_a_message_not_in_the_chat_is_refused(new_chat, scripted):
    with pytest.raises(EditError, match="no messages"):
        new_chat.fork()
    scripted.add("Hello.")
    new_chat.ask("Hi")
    with pytest.raises(EditError, match="No message"):
        new_chat.fork(at=424242)


# -- signals, async, statements -------------------------------------------------------------------
@pytest.mark.django_db
def test_messages_superseded_names_the_replaced_rows(chat, scripted):
    scripted.add("Old.", "New.")
    chat.ask("Hi")
    replaced = list(chat.messages.order_by("id").values_list("pk", flat=True))
    seen: list[dict[str, Any]] = []
    messages_superseded.connect(
        lambda sender, **kw: seen.append(kw), weak=False, dispatch_uid="t-superseded"
    )
    try:
        chat.regenerate()
    finally:
        messages_superseded.disconnect(dispatch_uid="t-superseded")

    assert [(kw["chat"], kw["message_ids"], kw["tool_call_ids"]) for kw in seen] == [
        (chat, replaced, [])
    ]


@pytest.mark.django_db
def test_the_async_forms_do_what_the_sync_ones_do(chat, scripted):
    scripted.add("Old.", "New.", "Edited.")
    chat.ask("Hi")

    assert async_to_sync(chat.aregenerate)().content == "New."
    assert async_to_sync(chat.aedit_later)(_users(chat)[0], "Hi!") is chat
    assert async_to_sync(chat.acomplete)().content == "Edited."
    assert async_to_sync(chat.aregenerate_later)() is chat
    forked = async_to_sync(chat.afork)()
    assert current(forked) == [("user", "Hi!")]


@pytest.mark.django_db
def test_an_edit_costs_the_same_statements_whatever_the_history(user, scripted):
    def statements(turns: int) -> int:
        chat = Chat.objects.create(model="scripted:test", owner=user)
        for turn in range(turns):
            scripted.add(f"Answer {turn}.")
            chat.ask(f"Question {turn}")
        first = _users(chat)[0]
        chat = Chat.objects.get(pk=chat.pk)
        with CaptureQueriesContext(connection) as queries:
            chat.edit_later(first, "Edited")
        return len(queries)

    assert statements(2) == statements(40)


@pytest.mark.django_db
def test_live_pages_hear_which_messages_were_superseded(chat, scripted, redis_events):
    from agentloop import live_events as events

    scripted.add("Old.", "New.")
    chat.ask("Hi")
    replaced = list(chat.messages.order_by("id").values_list("pk", flat=True))

    chat.regenerate()
    assert events.flush()

    kept = events.get_backend().read(events.chat_key(chat), None, 1.0)
    types = [event["type"] for event in kept]
    assert ("superseded", {"ids": replaced}) in [(e["type"], e["data"]) for e in kept]
    # Announced before the replacement and its answer, so a page drops the old rows first.
    assert types[types.index("superseded") :].count("message") == 2


@pytest.mark.django_db
def test_a_chat_model_of_your_own_is_edited_and_forked_too(scripted):
    from example_project.models import SupportConversation, Ticket

    ticket = Ticket.objects.create(subject="Refund for order 42")
    chat = SupportConversation.objects.create(model="scripted:test", ticket=ticket)
    scripted.add("Old.", "New.", "Forked.")
    chat.ask("Refund?")

    assert chat.regenerate().content == "New."
    forked = chat.fork()

    assert isinstance(forked, SupportConversation) and forked.ticket == ticket
    assert forked.ask("And now?").content == "Forked."
    assert [m.content for m in chat.messages.current()] == ["Refund?", "New."]
    assert chat.messages.superseded().count() == 2


def test_an_edited_message_is_judged_by_the_input_guardrails(new_chat, scripted):
    new_chat.with_guardrails(no_passwords)
    scripted.add("Hello.")
    new_chat.ask("Hi")

    with pytest.raises(GuardrailBlockedError, match="no_passwords"):  # as ask() would
        new_chat.edit(_users(new_chat)[-1], "my password is hunter2")

    assert len(scripted.requests) == 1  # the model never saw the edited message
    blocked = _users(new_chat)[-1]
    assert (blocked.content, blocked.status) == ("my password is hunter2", "blocked")
    state = new_chat.store.stop_reason if isinstance(new_chat, Conversation) else None
    if state is None:
        new_chat.refresh_from_db()
        state = new_chat.stop_reason
    assert state == "guardrail no_passwords: the message shares a password"
