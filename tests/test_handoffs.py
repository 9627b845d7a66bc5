"""Handoffs the model can call (issue 24, part 3): ``with_handoffs``/``Agent.handoffs`` offer
``transfer_to_<agent>`` tools; a call switches the chat's agent at once (the very next model
call is the new agent's), persisted and shown in the admin, in process and in a background
job alike; a tool calling ``Other.find(pk)`` on its own chat hands it over the same way.

The Celery worker's side is tests/test_handoffs_celery.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import agentloop
from agentloop import ConfigurationError, signals
from agentloop.agents import HandoffTool
from agentloop.models import Chat, ChatState, Message, ToolCall
from agentloop.runners import run_step
from agentloop.testing import tool_call
from tests.handoff_agents import Billing, Escalate, EscalateInMemory, Plain, Refunds, Triage
from tests.tools import add

BILLING_TOOLS = ["invoice_total", "transfer_to_triage"]
TRIAGE_TOOLS = ["lookup_order", "transfer_to_billing", "transfer_to_refunds"]


def made(scripted: Any) -> list[tuple[str, str, list[str]]]:
    """Each request the model got: its model, its first message (the instructions) and the
    tools offered, in order."""
    return [
        (request.model, request.messages[0].content, sorted(t.name for t in request.tools))
        for request in scripted.requests
    ]


def handoffs_of(chat: Chat) -> list[tuple[str, Any]]:
    calls = chat.tool_calls.order_by("id").filter(handoff__isnull=False)
    return list(calls.values_list("name", "handoff"))


@pytest.fixture
def triage(user) -> Chat:
    return Triage.create(owner=user, customer="Ada")


# -- what the model is offered ---------------------------------------------------------------
def test_an_agents_handoffs_are_tools_named_and_described_after_the_target_agent():
    definition = Refunds.as_handoff().definition()

    assert definition.name == "transfer_to_refunds"
    assert (
        definition.description == "Hand the conversation over to the Refunds agent: Refunds orders."
    )
    assert definition.parameters["properties"] == {
        "customer": {"default": "", "description": "Who is asking.", "type": "string"},
        "order": {"default": "", "description": "The order to refund.", "type": "string"},
    }
    assert definition.parameters.get("required", []) == []  # stored inputs fill the rest


def test_as_handoff_takes_a_name_a_description_and_bound_inputs():
    tool = Refunds.as_handoff(name="escalate_refund", description="Refund it.", order="7")

    definition = tool.definition()
    assert (definition.name, definition.description) == ("escalate_refund", "Refund it.")
    assert list(definition.parameters["properties"]) == ["customer"]
    with pytest.raises(ConfigurationError, match="Refunds has no input"):
        Refunds.as_handoff(amount="7")


@pytest.mark.django_db
def test_a_persisted_chat_offers_its_handoffs_in_any_process_by_reference(user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_handoffs(
        Billing, Refunds.as_handoff(name="refund", order="7"), "tests.handoff_agents.Plain"
    )

    assert chat.tools == [
        "handoff:tests.handoff_agents.Billing",
        'handoff:tests.handoff_agents.Refunds?{"__name__": "refund", "order": "7"}',
        "handoff:tests.handoff_agents.Plain",
    ]
    offered = Chat.objects.get(pk=chat.pk).conversation.tools()  # loaded again from the row
    assert sorted(offered) == ["refund", "transfer_to_billing", "transfer_to_plain"]
    assert offered["refund"].bound_inputs == {"order": "7"}


def test_with_handoffs_refuses_what_is_not_an_agent():
    with pytest.raises(ConfigurationError, match="is not an agent"):
        agentloop.chat("scripted:test").with_handoffs(add)


# -- the handoff, in process ----------------------------------------------------------------
@pytest.mark.django_db
def test_the_model_hands_a_chat_over_and_the_next_model_call_of_the_same_ask_is_the_new_agents(
    triage, scripted
):
    scripted.add(tool_call("transfer_to_billing", id="t1"), "Your invoice is 42 EUR.")

    answer = triage.ask("What is my invoice?")

    assert answer.content == "Your invoice is 42 EUR."
    assert made(scripted) == [
        ("triage", "You are TRIAGE for Ada.", TRIAGE_TOOLS),
        ("billing", "You are BILLING for Ada.", BILLING_TOOLS),
    ]
    triage.refresh_from_db()
    assert (triage.agent_path, triage.agent_inputs, triage.agent_digest) == (
        "tests.handoff_agents.Billing",
        {"customer": "Ada"},
        Billing.fingerprint({"customer": "Ada"}),
    )
    assert triage.model == "scripted:billing"
    assert triage.messages.get(tool_call__call_id="t1").content == (
        "Handed off from Triage to Billing: Billing goes on."
    )
    assert handoffs_of(triage) == [
        (
            "transfer_to_billing",
            {
                "from": "tests.handoff_agents.Triage",
                "to": "tests.handoff_agents.Billing",
                "inputs": {"customer": "Ada"},
            },
        )
    ]


@pytest.mark.django_db
def test_the_next_turn_and_a_chat_loaded_again_go_on_under_the_new_agent(triage, scripted):
    scripted.add(tool_call("transfer_to_billing"), "42 EUR.", "Paid on the 3rd.")
    triage.ask("What is my invoice?")

    assert Chat.objects.get(pk=triage.pk).ask("When was it paid?").content == "Paid on the 3rd."
    assert made(scripted)[-1] == ("billing", "You are BILLING for Ada.", BILLING_TOOLS)


@pytest.mark.django_db
def test_nothing_of_the_previous_agent_stays_behind(triage, scripted):
    assert (triage.temperature, triage.tool_options["choice"], triage.limits) == (
        0.1,
        "required",
        {"max_tool_calls": 20},
    )
    scripted.add(tool_call("transfer_to_billing"), "42 EUR.")

    triage.ask("What is my invoice?")

    triage.refresh_from_db()
    assert triage.temperature is None
    assert triage.tool_options.get("choice") is None
    assert triage.limits == {}
    last = scripted.requests[-1]
    assert (last.temperature, last.tool_choice) == (None, None)


@pytest.mark.django_db
def test_the_model_fills_the_new_agents_inputs_and_the_stored_ones_fill_the_rest(triage, scripted):
    scripted.add(tool_call("transfer_to_refunds", {"order": "7"}), "Refunded.")

    triage.ask("Refund order 7")

    assert made(scripted)[-1] == (
        "refunds",
        "You are REFUNDS for Ada, refunding order 7.",
        [],
    )
    triage.refresh_from_db()
    assert triage.agent_inputs == {"customer": "Ada", "order": "7"}


@pytest.mark.django_db
def test_a_handoff_missing_an_input_is_not_made_and_the_model_hears_why(triage, scripted):
    scripted.add(tool_call("transfer_to_refunds", id="r1"), "Which order?")

    triage.ask("I want a refund")

    assert triage.messages.get(tool_call__call_id="r1").content == (
        "Not handed off to Refunds: Refunds needs the input(s) order."
    )
    assert triage.tool_calls.get(call_id="r1").state == "failed"
    assert made(scripted)[-1][0] == "triage"  # the current agent goes on
    triage.refresh_from_db()
    assert triage.agent_path == "tests.handoff_agents.Triage"
    assert handoffs_of(triage) == []


@pytest.mark.django_db
def test_a_handoff_to_an_agent_on_a_model_nobody_serves_changes_nothing(user, scripted):
    chat = Triage.create(owner=user, customer="Ada").with_handoffs(
        "tests.handoff_agents.Unservable"
    )
    scripted.add(tool_call("transfer_to_unservable", id="u1"), "Still triage.")

    chat.ask("go")

    result = chat.messages.get(tool_call__call_id="u1").content
    assert result.startswith("Not handed off to Unservable: ")
    assert "nowhere" in result
    chat.refresh_from_db()
    assert (chat.agent_path, chat.model) == ("tests.handoff_agents.Triage", "scripted:triage")
    assert chat.messages.get(role="system").content == "You are TRIAGE for Ada."


@pytest.mark.django_db
def test_a_handoff_failing_halfway_is_undone_and_the_run_goes_on_as_it_was(triage, scripted):
    triage.with_handoffs("tests.handoff_agents.Sloppy")
    scripted.add(tool_call("transfer_to_sloppy", id="s1"), "Still triage.")

    assert triage.ask("go").content == "Still triage."

    result = triage.messages.get(tool_call__call_id="s1").content
    assert result.startswith("Not handed off to Sloppy: The @tool function")
    assert "can't be stored by import path" in result
    assert made(scripted)[-1][:2] == ("triage", "You are TRIAGE for Ada.")  # not "sloppy"
    triage.refresh_from_db()
    assert (triage.agent_path, triage.model, triage.temperature) == (
        "tests.handoff_agents.Triage",
        "scripted:triage",
        0.1,
    )
    assert triage.messages.get(role="system").content == "You are TRIAGE for Ada."


def test_a_handoff_failing_halfway_in_memory_is_undone_too(scripted):
    chat = Triage.chat(customer="Ada")
    before = chat.store.config.get_config()

    with pytest.raises(ConfigurationError, match="Invalid limits"):
        with chat.store.atomic():
            Billing.configure(chat, customer="Ada")
            chat.with_limits(max_bananas=3)  # fails after the configuration was applied

    assert chat.store.config.get_config() == before
    assert [m.content for m in chat.messages if m.role == "system"] == ["You are TRIAGE for Ada."]
    assert chat.store.agent is Triage


@pytest.mark.django_db
def test_an_agent_without_instructions_takes_the_previous_ones_away(triage, scripted):
    triage.with_handoffs(Plain)
    scripted.add(tool_call("transfer_to_plain"), "Plain.")

    triage.ask("go")

    assert made(scripted)[-1][:2] == ("plain", "")


# -- other calls of the round ---------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("concurrency", [None, "threads"])
def test_other_calls_of_the_round_run_and_only_the_answers_first_handoff_is_made(
    triage, scripted, concurrency
):
    triage.with_tool_options(concurrency=concurrency)
    scripted.add(
        [
            tool_call("lookup_order", {"order": "7"}, id="l1"),
            tool_call("transfer_to_refunds", {"order": "7"}, id="r1"),
            tool_call("transfer_to_billing", id="b1"),
        ],
        "Refunded.",
    )

    triage.ask("Refund order 7, or bill me")

    results = dict(triage.messages.filter(role="tool").values_list("tool_call__call_id", "content"))
    assert results == {
        "l1": "order 7: 2 items, paid",
        "r1": "Handed off from Triage to Refunds: Refunds goes on.",
        "b1": "Not handed off: an answer hands the conversation to one agent; an earlier "
        "call of this answer does.",
    }
    assert triage.tool_calls.get(call_id="b1").state == "failed"
    assert [name for name, _ in handoffs_of(triage)] == ["transfer_to_refunds"]
    assert made(scripted)[-1][0] == "refunds"


@pytest.mark.django_db
def test_a_tool_asking_for_a_second_handoff_in_a_round_keeps_its_result_and_hears_why(
    user, scripted
):
    chat = Triage.create(owner=user, customer="Ada").with_tools(Escalate)
    scripted.add(
        [
            tool_call("transfer_to_refunds", {"order": "7"}, id="r1"),
            tool_call("escalate", {"customer": "Ada"}, id="e1"),
        ],
        "Refunded.",
    )

    chat.ask("go")

    assert chat.messages.get(tool_call__call_id="e1").content == (
        "escalated for Ada\n\n[Not handed off: call r1 of this answer already handed the "
        "conversation to Refunds.]"
    )
    assert chat.tool_calls.get(call_id="e1").state == "succeeded"
    chat.refresh_from_db()
    assert chat.agent_path == "tests.handoff_agents.Refunds"


# -- loops ------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_handoff_loop_is_cut_at_max_handoffs_per_turn_and_the_next_turn_starts_afresh(
    triage, scripted, settings
):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "MAX_HANDOFFS": 3}
    ping_pong = [tool_call("transfer_to_billing"), tool_call("transfer_to_triage")] * 2
    scripted.add(*ping_pong, "Triage answers.")

    assert triage.ask("loop").content == "Triage answers."

    names = [name for name, _ in handoffs_of(triage)]
    assert names == ["transfer_to_billing", "transfer_to_triage", "transfer_to_billing"]
    refused = triage.messages.filter(role="tool").order_by("id").last()
    assert refused.content == (
        "Not handed off: this turn already handed the conversation over 3 times, the limit "
        "(AGENTLOOP['MAX_HANDOFFS'])."
    )
    assert refused.is_error
    assert made(scripted)[-1][0] == "billing"  # the agent the last handoff made goes on
    scripted.add(tool_call("transfer_to_triage"), "Triage again.")
    assert triage.ask("next").content == "Triage again."  # a new turn, a new count
    triage.refresh_from_db()
    assert triage.agent_path == "tests.handoff_agents.Triage"


# -- in a tool: find() on the tool's own chat -------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("concurrency", [None, "threads"])
def test_a_tool_calling_find_on_its_chat_hands_the_running_ask_over_at_once(
    user, scripted, concurrency
):
    """The issue's defect: the rest of an in-process ask() kept the old instructions."""
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(Escalate, add)
    chat.with_tool_options(concurrency=concurrency)
    scripted.add(
        [tool_call("escalate", {"customer": "Ada"}, id="e1"), tool_call("add", {"a": 1, "b": 2})],
        "Your invoice is 42 EUR.",
    )

    assert chat.ask("bill me").content == "Your invoice is 42 EUR."

    assert made(scripted)[-1] == ("billing", "You are BILLING for Ada.", BILLING_TOOLS)
    chat.refresh_from_db()
    assert chat.agent_path == "tests.handoff_agents.Billing"
    assert handoffs_of(chat) == [
        (
            "escalate",
            {"from": "", "to": "tests.handoff_agents.Billing", "inputs": {"customer": "Ada"}},
        )
    ]
    assert chat.messages.get(tool_call__call_id="e1").content == "escalated for Ada"


@pytest.mark.django_db
def test_a_transactional_tool_hands_off_in_its_own_transaction(user, scripted):
    from example_project.models import Note
    from tests.handoff_agents import EscalateAndNote

    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(EscalateAndNote)
    scripted.add(tool_call("escalate_and_note"), "42 EUR.")

    assert chat.ask("bill me").content == "42 EUR."

    assert made(scripted)[-1][:2] == ("billing", "You are BILLING for Ada.")
    assert Note.objects.filter(chat=chat).count() == 1
    assert handoffs_of(chat)[0][1]["to"] == "tests.handoff_agents.Billing"


@pytest.mark.django_db(transaction=True)
def test_a_tool_calling_find_hands_an_aask_over_at_once(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(Escalate)
    scripted.add(tool_call("escalate", {"customer": "Ada"}), "42 EUR.")

    assert async_to_sync(chat.aask)("bill me").content == "42 EUR."

    assert made(scripted)[-1][:2] == ("billing", "You are BILLING for Ada.")


@pytest.mark.django_db
def test_find_elsewhere_hands_the_chat_over_at_once_and_says_so(triage, scripted):
    received = []

    def on_handed_off(sender, chat, from_agent, to_agent, inputs, tool_call, **kwargs):
        received.append((chat.pk, from_agent, to_agent, inputs, tool_call))

    signals.chat_handed_off.connect(on_handed_off)
    try:
        handed = Billing.find(triage.pk)
    finally:
        signals.chat_handed_off.disconnect(on_handed_off)

    assert handed.agent_path == "tests.handoff_agents.Billing"
    assert handed.messages.get(role="system").content == "You are BILLING for Ada."
    assert received == [
        (
            triage.pk,
            "tests.handoff_agents.Triage",
            "tests.handoff_agents.Billing",
            {"customer": "Ada"},
            None,
        )
    ]


@pytest.mark.django_db
def test_the_handed_off_signal_names_the_call_that_made_the_handoff(triage, scripted):
    received = []

    def on_handed_off(sender, chat, from_agent, to_agent, tool_call, **kwargs):
        # Sent after the commit: the chat is the new agent's already.
        row = Chat.objects.get(pk=chat.pk)
        received.append((from_agent, to_agent, tool_call.call_id, row.agent_path))

    signals.chat_handed_off.connect(on_handed_off)
    try:
        scripted.add(tool_call("transfer_to_billing", id="t1"), "42 EUR.")
        triage.ask("bill me")
    finally:
        signals.chat_handed_off.disconnect(on_handed_off)

    billing = "tests.handoff_agents.Billing"
    assert received == [("tests.handoff_agents.Triage", billing, "t1", billing)]


# -- the background job path ------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_background_job_makes_the_handoff_and_the_next_job_asks_the_new_agent(triage, scripted):
    scripted.add(tool_call("transfer_to_billing", id="t1"), "42 EUR.")
    triage.ask_later("bill me")
    Chat.objects.filter(pk=triage.pk).update(state=ChatState.QUEUED)

    assert run_step(triage.pk).action == "again"  # Triage asks for the handoff
    assert run_step(triage.pk).action == "again"  # the round hands the chat over
    handed = Chat.objects.get(pk=triage.pk)
    assert (handed.agent_path, handed.model, handed.lease_token) == (
        "tests.handoff_agents.Billing",
        "scripted:billing",
        "",
    )
    assert run_step(triage.pk).action == "done"  # Billing answers

    assert made(scripted) == [
        ("triage", "You are TRIAGE for Ada.", TRIAGE_TOOLS),
        ("billing", "You are BILLING for Ada.", BILLING_TOOLS),
    ]
    assert Chat.objects.get(pk=triage.pk).state == ChatState.IDLE


@pytest.mark.django_db
def test_step_by_step_driving_hands_over_in_the_tools_step(triage, scripted):
    scripted.add(tool_call("transfer_to_billing"), "42 EUR.")
    triage.ask_later("bill me")

    triage.step()  # the model
    triage.step()  # the round: the handoff
    assert Chat.objects.get(pk=triage.pk).agent_path == "tests.handoff_agents.Billing"
    assert triage.step().content == "42 EUR."
    assert made(scripted)[-1][0] == "billing"


def _handoff_round_statements(chat: Chat, scripted: Any) -> int:
    scripted.add(tool_call("transfer_to_billing"))
    chat.ask_later("bill me")
    chat.generate()
    with CaptureQueriesContext(connection) as queries:
        chat.run_tools()
    return len(queries.captured_queries)


@pytest.mark.django_db
def test_a_handoff_round_costs_the_same_statements_at_any_history_length(user, scripted):
    short = Triage.create(owner=user, customer="Ada")
    long = Triage.create(owner=user, customer="Bob")
    Message.objects.bulk_create(
        Message(chat=long, role=role, content=f"{role} {n}")
        for n in range(100)
        for role in ("user", "assistant")
    )

    statements = _handoff_round_statements(short, scripted)

    assert _handoff_round_statements(long, scripted) == statements
    # The claim, the transcript, the call's claim, the take-over (the configuration columns,
    # the instructions, the agent), the record, the result, the transcript read again (the
    # instructions changed) and the release; savepoints around each write in a transaction.
    assert statements == (28 if connection.vendor == "postgresql" else 30)


# -- in memory --------------------------------------------------------------------------------
def test_an_in_memory_chat_is_handed_over_and_follows_its_new_agent(scripted):
    chat = Triage.chat(customer="Ada")
    handoffs: list[tuple[Any, ...]] = []
    chat.on("handed_off", lambda record, call: handoffs.append((record["to"], call.id)))
    scripted.add(tool_call("transfer_to_billing", id="t1"), "42 EUR.")

    assert chat.ask("bill me").content == "42 EUR."

    assert made(scripted)[-1] == ("billing", "You are BILLING for Ada.", BILLING_TOOLS)
    assert handoffs == [("tests.handoff_agents.Billing", "t1")]
    assert chat.store.agent is Billing
    (call,) = [c for m in chat.messages for c in m.tool_calls]
    assert call.handoff == {
        "from": "tests.handoff_agents.Triage",
        "to": "tests.handoff_agents.Billing",
        "inputs": {"customer": "Ada"},
    }
    Billing.instructions = "You are BILLING for {customer}. Be brief."  # a deploy
    try:
        scripted.add("Brief.")
        chat.ask("and?")
        assert made(scripted)[-1][1] == "You are BILLING for Ada. Be brief."
    finally:
        Billing.instructions = "You are BILLING for {customer}."


def test_a_plain_in_memory_chat_takes_handoffs_and_a_tool_can_hand_it_over(scripted):
    chat = agentloop.chat("scripted:test", instructions="You help.", tools=[EscalateInMemory])
    chat.with_handoffs(Refunds)
    scripted.add(tool_call("escalate"), "42 EUR.")

    with pytest.raises(ConfigurationError, match="needs the input"):
        Billing.take_over(chat, {})  # nothing stored to fill the customer from
    chat.store.agent_inputs = {"customer": "Ada"}
    chat.ask("bill me")

    assert made(scripted)[-1] == ("billing", "You are BILLING for Ada.", BILLING_TOOLS)


def test_a_store_that_keeps_no_handoffs_refuses_them_clearly(scripted):
    from agentloop.engine import Conversation, MemoryStore

    class NoHandoffs(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.handoffs = None

    chat: Conversation = Conversation(NoHandoffs()).with_model("scripted:test")
    chat.with_handoffs(Plain)
    scripted.add(tool_call("transfer_to_plain", id="p1"), "Still me.")

    chat.ask("go")

    (result,) = [m for m in chat.messages if m.role == "tool"]
    assert (
        result.content == "Not handed off: NoHandoffs keeps no handoffs (store.handoffs is None)."
    )
    assert chat.store.agent is None


# -- the admin ----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_admin_timeline_shows_who_handed_the_chat_to_whom(admin_client, triage, scripted):
    scripted.add(tool_call("transfer_to_billing"), "42 EUR.")
    triage.ask("bill me")

    content = admin_client.get(reverse("admin:agentloop_chat_change", args=[triage.pk])).content

    assert b'<p class="agentloop-handoff"' in content
    assert b"Handed off from Triage to Billing</p>" in content
    assert b"tests.handoff_agents.Billing" in content  # the chat's agent


def test_a_handoff_tool_is_a_handoff_tool():
    assert issubclass(Billing.as_handoff(), HandoffTool)
    assert Billing.as_handoff().handoff_agent is Billing
    assert ToolCall._meta.get_field("handoff").null
