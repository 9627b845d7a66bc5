"""Agents (docs/design.md §5): a chat's configuration as a class, and agents as tools (subagents).

Agents live in tests/agents.py (and tests/billing, tests/legal for name clashes); their
model "agents:test" is a provider answering each chat from its own script, chosen by the
chat's instructions, so a parent and its child never take each other's replies.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import agentloop
from agentloop import CancelledError, ConfigurationError
from agentloop.agents import AgentTool
from agentloop.agents.subagents import SUBAGENT_CANCELLED_RESULT
from agentloop.engine._tool_rounds import DENIED_RESULT
from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import stream, tool_call
from tests.agents import (
    Briefing,
    Calculator,
    Director,
    Formatter,
    Interviewer,
    Judge,
    Lead,
    Research,
    Stepper,
)
from tests.billing import agents as billing
from tests.helpers import transcript
from tests.legal import agents as legal
from tests.processes import run_script

EMBEDDED = {"BACKGROUND": "embedded", "CANCEL_POLL_INTERVAL": 0.05}


def runs(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def settle_background():
    assert wait_for_embedded_jobs(timeout=60), "background jobs did not finish"


def eventually(condition) -> None:
    """Poll a database condition no event announces (fails after 30 s)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- Agent.create / find / chat ---------------------------------------------------------------
@pytest.mark.django_db
def test_create_makes_a_persisted_chat_configured_by_the_agent(user):
    chat = Calculator.create(owner=user)

    row = Chat.objects.get(pk=chat.pk)
    assert (row.owner, row.model, row.title) == (user, "agents:test", "Calculator")
    assert row.agent_path == "tests.agents.Calculator"
    assert row.tools == ["tests.tools.add"]
    assert row.tool_options["calls"] == "one"
    assert row.temperature == 0.2
    assert row.limits == {"max_model_calls": 5}
    assert transcript(row) == [("system", "You are CALCULATOR.")]


@pytest.mark.django_db
def test_create_renders_the_instructions_with_the_inputs(user):
    chat = Briefing.create(owner=user, topic="owls", reader="the board")

    assert transcript(chat) == [("system", "You are BRIEFING. Brief the board on owls.")]


@pytest.mark.django_db
def test_braces_in_instructions_that_name_no_input_are_kept():
    chat = Formatter.create()

    assert transcript(chat) == [
        ("system", "You are FORMATTER. Reply as {answer} with {{no}} inputs.")
    ]


@pytest.mark.django_db
def test_create_without_an_input_raises_naming_it_and_saves_nothing(user):
    with pytest.raises(ConfigurationError, match="Briefing needs the input.*reader"):
        Briefing.create(owner=user, topic="owls")

    assert Chat.objects.count() == 0


@pytest.mark.django_db
def test_create_with_an_unknown_input_raises_naming_it_and_saves_nothing(user):
    with pytest.raises(ConfigurationError, match="Research has no input.*colour"):
        Research.create(owner=user, topic="owls", colour="blue")

    assert Chat.objects.count() == 0


@pytest.mark.django_db
def test_find_returns_the_agents_chat_and_it_carries_on_configured(brains, user):
    created = Research.create(owner=user, topic="owls")
    brains.script("You are RESEARCH.", "Owls hunt at night.")

    found = Research.find(created.pk)
    answer = found.ask("When do owls hunt?")

    assert found.pk == created.pk
    assert answer.content == "Owls hunt at night."
    (request,) = brains.requests
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "You are RESEARCH. You research owls."),
        ("user", "When do owls hunt?"),
    ]


@pytest.mark.django_db
def test_chat_is_an_in_memory_chat_configured_by_the_agent(brains):
    brains.script("You are RESEARCH.", "Owls hunt at night.")

    chat = Research.chat(topic="owls")
    answer = chat.ask("When?")

    assert isinstance(chat, agentloop.Conversation)
    assert answer.content == "Owls hunt at night."
    assert brains.requests[0].messages[0].content == "You are RESEARCH. You research owls."
    assert Chat.objects.count() == 0


def test_chat_without_an_input_raises():
    with pytest.raises(ConfigurationError, match="needs the input.*topic"):
        Research.chat()


def test_an_agent_without_a_description_uses_its_docstring():
    assert Research.description == "Researches a topic and reports back."


# -- an agent as a tool --------------------------------------------------------------------------
def test_an_agent_as_a_tool_is_named_in_snake_case_and_described_by_the_agent():
    research = Research.as_tool()

    assert issubclass(research, AgentTool)
    assert research.name == "research"
    assert research.definition().description == "Researches a topic and reports back."


def test_the_tool_takes_a_task_and_the_agents_inputs():
    parameters = Briefing.as_tool().definition().parameters

    assert sorted(parameters["properties"]) == ["reader", "task", "topic"]
    assert sorted(parameters["required"]) == ["reader", "task", "topic"]


def test_input_descriptions_reach_the_tool_schema():
    properties = Research.as_tool().definition().parameters["properties"]

    assert properties["topic"]["description"] == "The subject to research."


def test_inputs_bound_by_as_tool_are_no_parameters():
    parameters = Briefing.as_tool(reader="the board").definition().parameters

    assert sorted(parameters["properties"]) == ["task", "topic"]


def test_binding_an_unknown_input_raises():
    with pytest.raises(ConfigurationError, match="Briefing has no input.*colour"):
        Briefing.as_tool(colour="blue")


@pytest.mark.django_db
def test_with_tools_takes_an_agent_class_and_stores_it_as_an_agent_reference(user):
    chat = Chat.objects.create(model="agents:test", owner=user).with_tools(Research)

    assert chat.tools == ["agent:tests.agents.Research"]
    assert list(Chat.objects.get(pk=chat.pk).conversation.tools()) == ["research"]


@pytest.mark.django_db
def test_bound_inputs_and_a_custom_name_survive_a_reload(user):
    chat = Chat.objects.create(model="agents:test", owner=user)
    chat.with_tools(Briefing.as_tool(name="brief", reader="the board"))

    fresh = Chat.objects.get(pk=chat.pk)
    (tool,) = fresh.conversation.tools().values()

    assert tool.name == "brief"
    assert tool.bound_inputs == {"reader": "the board"}
    assert sorted(tool.definition().parameters["properties"]) == ["task", "topic"]


@pytest.mark.django_db
def test_a_reloaded_chat_runs_the_subagent_with_its_bound_inputs(brains, user):
    chat = Chat.objects.create(model="agents:test", owner=user)
    chat.with_instructions("You are LEAD.").with_tools(Briefing.as_tool(reader="the board"))
    brains.script(
        "You are LEAD.",
        tool_call("briefing", {"task": "Summarise the year", "topic": "sales"}, id="c1"),
        "Briefed.",
    )
    brains.script("You are BRIEFING.", "Sales doubled.")

    Chat.objects.get(pk=chat.pk).ask("Brief the board")

    child = Chat.objects.get(parent=chat)
    assert transcript(child)[0] == ("system", "You are BRIEFING. Brief the board on sales.")


@pytest.mark.django_db
def test_an_unknown_agent_reference_is_an_error_naming_it(user):
    chat = Chat.objects.create(model="agents:test", owner=user, tools=["agent:tests.agents.Nope"])

    with pytest.raises(ConfigurationError, match="tests.agents.Nope"):
        chat.conversation.tools()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "order", [(legal.Research, billing.Research), (billing.Research, legal.Research)]
)
def test_two_agents_of_one_name_both_take_their_package_as_prefix_in_any_order(user, order):
    chat = Chat.objects.create(model="agents:test", owner=user)

    chat.with_tools(*order)

    assert sorted(chat.conversation.tools()) == ["billing_research", "legal_research"]
    tools = Chat.objects.get(pk=chat.pk).conversation.tools()
    assert tools["billing_research"].agent_class is billing.Research
    assert tools["legal_research"].agent_class is legal.Research


@pytest.mark.django_db
def test_agents_added_one_call_at_a_time_get_the_same_names(user):
    chat = Chat.objects.create(model="agents:test", owner=user)

    chat.with_tools(legal.Research).with_tools(billing.Research).with_tools(legal.Research)

    tools = Chat.objects.get(pk=chat.pk).conversation.tools()
    assert sorted(tools) == ["billing_research", "legal_research"]
    assert tools["legal_research"].agent_class is legal.Research


@pytest.mark.django_db
def test_an_agent_alone_again_gets_its_own_name_back(user):
    chat = Chat.objects.create(model="agents:test", owner=user)

    chat.with_tools(Research, billing.Research)
    assert sorted(chat.conversation.tools()) == ["billing_research", "tests_research"]
    chat.with_tools(billing.Research, replace=True)

    assert list(Chat.objects.get(pk=chat.pk).conversation.tools()) == ["research"]


@pytest.mark.django_db
def test_the_same_agent_twice_is_one_tool(user):
    chat = Chat.objects.create(model="agents:test", owner=user)

    chat.with_tools(Research, Research)

    assert chat.tools == ["agent:tests.agents.Research"]


@pytest.mark.django_db
def test_a_prefixed_agent_tool_runs_its_own_agent(brains, user):
    chat = Chat.objects.create(model="agents:test", owner=user)
    chat.with_instructions("You are LEAD.").with_tools(billing.Research)
    chat.with_tools(legal.Research)
    brains.script(
        "You are LEAD.", tool_call("billing_research", {"task": "Why two invoices?"}), "Done."
    )
    brains.script("You are BILLING RESEARCH.", "A duplicate run.")

    Chat.objects.get(pk=chat.pk).ask("Explain the invoices")

    child = Chat.objects.get(parent=chat)
    assert child.agent_path == "tests.billing.agents.Research"
    assert transcript(child)[-1] == ("assistant", "A duplicate run.")


# -- subagents, in-process -------------------------------------------------------------------------
@pytest.fixture
def researched(brains, user):
    """A Lead chat that handed one research task to a subagent, run in-process."""
    brains.script(
        "You are LEAD.",
        tool_call("research", {"task": "When do owls hunt?", "topic": "owls"}, id="c1"),
        "Owls hunt at night, says research.",
    )
    brains.script("You are RESEARCH.", "At night.")
    chat = Lead.create(owner=user)
    answer = chat.ask("Tell me about owls")
    return chat, answer


@pytest.mark.django_db
def test_a_subagent_runs_a_child_chat_linked_to_the_parent_and_its_call(researched, user):
    chat, _ = researched

    child = Chat.objects.get(parent=chat)
    call = ToolCall.objects.get(chat=chat, call_id="c1")
    assert child.parent_tool_call == call
    assert child.owner == user
    assert child.agent_path == "tests.agents.Research"


@pytest.mark.django_db
def test_the_child_gets_the_task_as_its_message_and_the_inputs_in_its_instructions(researched):
    chat, _ = researched

    child = Chat.objects.get(parent=chat)
    assert transcript(child) == [
        ("system", "You are RESEARCH. You research owls."),
        ("user", "When do owls hunt?"),
        ("assistant", "At night."),
    ]


@pytest.mark.django_db
def test_the_tool_result_is_the_childs_last_answer(researched, brains):
    chat, answer = researched

    assert answer.content == "Owls hunt at night, says research."
    assert transcript(chat)[-2:] == [
        ("tool", "At night."),
        ("assistant", "Owls hunt at night, says research."),
    ]
    assert brains.requests_of("You are LEAD.")[1].messages[-1].content == "At night."
    brains.assert_complete()


@pytest.mark.django_db
def test_each_call_gets_its_own_child(brains, user):
    brains.script(
        "You are LEAD.",
        [
            tool_call("research", {"task": "Owls?", "topic": "owls"}, id="c1"),
            tool_call("research", {"task": "Bats?", "topic": "bats"}, id="c2"),
        ],
        "Both researched.",
    )
    brains.script("You are RESEARCH.", "Owls: nocturnal.", "Bats: nocturnal too.")
    chat = Lead.create(owner=user)

    chat.ask("Owls and bats")

    children = {c.parent_tool_call.call_id: transcript(c)[-1] for c in chat.children.all()}
    assert children == {
        "c1": ("assistant", "Owls: nocturnal."),
        "c2": ("assistant", "Bats: nocturnal too."),
    }


@pytest.mark.django_db
def test_a_subagent_with_a_schema_returns_its_structured_answer_as_json(brains, user):
    chat = Chat.objects.create(model="agents:test", owner=user)
    chat.with_instructions("You are LEAD.").with_tools(Judge)
    brains.script("You are LEAD.", tool_call("judge", {"task": "The cat did it?"}), "Guilty.")
    brains.script("You are JUDGE.", '{"guilty": true, "reason": "paw prints"}')

    chat.ask("Judge the cat")

    result = chat.messages.get(role="tool").content
    assert json.loads(result) == {"guilty": True, "reason": "paw prints"}


@pytest.mark.django_db
def test_subagents_nest_and_every_child_has_the_root_owner(brains, user):
    brains.script("You are DIRECTOR.", tool_call("lead", {"task": "Study owls"}), "Project done.")
    brains.script(
        "You are LEAD.", tool_call("research", {"task": "Owls?", "topic": "owls"}), "Owls done."
    )
    brains.script("You are RESEARCH.", "Owls are birds.")
    root = Director.create(owner=user)

    answer = root.ask("Run the owl project")

    lead = Chat.objects.get(parent=root)
    research = Chat.objects.get(parent=lead)
    assert answer.content == "Project done."
    assert (lead.agent_path, research.agent_path) == ("tests.agents.Lead", "tests.agents.Research")
    assert {lead.owner, research.owner} == {user}


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_a_parent_resumed_after_a_crash_in_its_subagent_reuses_the_child(scripted, user, run_log):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(Stepper)
    chat.ask_later("Do the steps")
    spec = {
        "verb": "complete",
        "replies": [  # one FIFO for both chats: the parent's answer, then the child's
            {"tool_calls": [{"id": "c1", "name": "stepper", "arguments": {"task": "Step two"}}]},
            {"tool_calls": [{"id": "s1", "name": "step_two", "arguments": {}}]},
        ],
    }

    crashed = run_script(
        "drive_chat.py",
        chat.pk,
        json.dumps(spec),
        env={"AGENTLOOP_TEST_CRASH_IN": "step_two", "AGENTLOOP_TEST_RUN_LOG": run_log},
    )
    assert crashed.returncode == 17, crashed.stderr
    # The dead process's claims (parent and child) run out, as they would LEASE_SECONDS later.
    Chat.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    scripted.add("Step two is done.", "All steps done.")
    answer = Chat.objects.get(pk=chat.pk).complete()

    assert answer.content == "All steps done."
    (child,) = Chat.objects.filter(parent=chat)
    assert [role for role, _ in transcript(child)] == [
        "system", "user", "assistant", "tool", "assistant"
    ]  # fmt: skip
    assert runs(run_log) == ["step_two", "step_two"]
    assert chat.messages.get(role="tool").content == "Step two is done."


@pytest.mark.django_db
def test_an_in_memory_chat_runs_its_subagent_in_memory(brains):
    brains.script(
        "You are LEAD.", tool_call("research", {"task": "Owls?", "topic": "owls"}), "Done."
    )
    brains.script("You are RESEARCH.", "Owls are birds.")
    chat = agentloop.chat("agents:test", instructions="You are LEAD.", tools=[Research])

    answer = chat.ask("Owls")

    assert answer.content == "Done."
    assert [m.content for m in chat.messages if m.role == "tool"] == ["Owls are birds."]
    assert Chat.objects.count() == 0


def test_an_in_memory_subagent_that_needs_a_person_gives_an_error_result(brains):
    brains.script("You are LEAD.", tool_call("interviewer", {"task": "Ask their name"}), "Ok.")
    brains.script("You are INTERVIEWER.", tool_call("ask_person", {"question": "Your name?"}))
    chat = agentloop.chat("agents:test", instructions="You are LEAD.", tools=[Interviewer])

    chat.ask("Find out my name")

    (result,) = [m for m in chat.messages if m.role == "tool"]
    assert result.is_error
    assert "can't wait" in result.content


# -- a child waiting for a person holds the parent (in-process) ----------------------------------
@pytest.fixture
def paying(brains, user, run_log):
    """A Lead chat whose Payer child waits for approval of a transfer (in-process)."""
    brains.script("You are LEAD.", tool_call("payer", {"task": "Pay Bob 5"}, id="c1"))
    brains.script("You are PAYER.", tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat = Lead.create(owner=user)
    chat.ask("Pay Bob")
    return chat, Chat.objects.get(parent=chat)


@pytest.mark.django_db
def test_a_child_waiting_for_approval_makes_the_parent_wait(paying, run_log):
    chat, child = paying

    assert child.is_waiting() and chat.is_waiting()
    assert [c.call_id for c in child.pending_approvals()] == ["t1"]
    call = ToolCall.objects.get(chat=chat, call_id="c1")
    assert (call.state, call.wait_reason) == (ToolCallState.WAITING, "subagent")
    assert chat.complete().role == "assistant"  # nothing to do: no step, no model call
    assert runs(run_log) == []


@pytest.mark.django_db
def test_approving_the_child_then_completing_it_settles_the_parents_call(paying, brains, user):
    chat, child = paying
    brains.script("You are PAYER.", "Paid Bob 5.")
    brains.script("You are LEAD.", "Bob is paid.")

    child.approve("t1", by=user)
    child.complete()
    answer = Chat.objects.get(pk=chat.pk).complete()

    assert answer.content == "Bob is paid."
    assert transcript(chat)[-2:] == [("tool", "Paid Bob 5."), ("assistant", "Bob is paid.")]
    brains.assert_complete()


@pytest.mark.django_db
def test_approving_the_child_runs_the_tool_once(paying, brains, user, run_log):
    _, child = paying
    brains.script("You are PAYER.", "Paid Bob 5.")

    child.approve("t1", by=user)
    child.complete()

    assert runs(run_log) == ["transfer"]


@pytest.mark.django_db
def test_denying_the_child_reaches_the_parent_as_the_childs_answer(paying, brains, user, run_log):
    chat, child = paying
    brains.script("You are PAYER.", "I was not allowed to pay Bob.")
    brains.script("You are LEAD.", "Bob was not paid.")

    child.deny("t1", reason="Bob was paid yesterday", by=user)
    child.complete()
    answer = Chat.objects.get(pk=chat.pk).complete()

    assert answer.content == "Bob was not paid."
    assert chat.messages.get(role="tool").content == "I was not allowed to pay Bob."
    denial = brains.requests_of("You are PAYER.")[1].messages[-1]
    assert denial.is_error and denial.content.startswith(DENIED_RESULT)
    assert runs(run_log) == []


# -- subagents in the background (the embedded runner: jobs on threads) --------------------------
@pytest.mark.django_db(transaction=True)
@override_settings(AGENTLOOP=EMBEDDED)
def test_a_background_subagent_runs_as_its_own_jobs_and_the_parent_resumes(brains, user):
    brains.script(
        "You are LEAD.",
        tool_call("research", {"task": "Owls?", "topic": "owls"}, id="c1"),
        "Owls hunt at night, says research.",
    )
    brains.script("You are RESEARCH.", "At night.")
    chat = Lead.create(owner=user)

    chat.ask_later("Tell me about owls").complete_later()
    settle_background()

    chat.refresh_from_db()
    child = Chat.objects.get(parent=chat)
    assert transcript(chat)[-2:] == [
        ("tool", "At night."),
        ("assistant", "Owls hunt at night, says research."),
    ]
    assert (chat.state, child.state) == ("idle", "idle")
    call = ToolCall.objects.get(chat=chat, call_id="c1")
    # The parent's call waited for the child and was settled by the child's answer.
    assert (call.wait_reason, call.decision, call.state) == ("subagent", "answered", "succeeded")
    assert child.parent_tool_call == call and child.owner == user
    brains.assert_complete()


@pytest.fixture
def paying_in_background(brains, user, run_log, settings):
    """A Lead chat run by workers whose Payer child waits for approval of a transfer."""
    settings.AGENTLOOP = EMBEDDED
    brains.script("You are LEAD.", tool_call("payer", {"task": "Pay Bob 5"}, id="c1"))
    brains.script("You are PAYER.", tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat = Lead.create(owner=user)
    chat.ask_later("Pay Bob").complete_later()
    settle_background()
    return Chat.objects.get(pk=chat.pk), Chat.objects.get(parent=chat)


@pytest.mark.django_db(transaction=True)
def test_a_background_child_waiting_for_approval_holds_the_parent(paying_in_background, run_log):
    chat, child = paying_in_background

    assert (chat.state, child.state) == ("waiting", "waiting")
    assert chat.is_waiting()
    assert [c.call_id for c in child.pending_approvals()] == ["t1"]
    assert runs(run_log) == []


@pytest.mark.django_db(transaction=True)
def test_approving_a_background_child_resumes_the_child_and_then_the_parent(
    paying_in_background, brains, user, run_log
):
    chat, child = paying_in_background
    brains.script("You are PAYER.", "Paid Bob 5.")
    brains.script("You are LEAD.", "Bob is paid.")

    child.approve("t1", by=user)
    settle_background()

    chat.refresh_from_db()
    assert transcript(chat)[-2:] == [("tool", "Paid Bob 5."), ("assistant", "Bob is paid.")]
    assert (chat.state, Chat.objects.get(pk=child.pk).state) == ("idle", "idle")
    assert runs(run_log) == ["transfer"]
    brains.assert_complete()


@pytest.mark.django_db(transaction=True)
def test_denying_a_background_child_resumes_both_without_running_the_tool(
    paying_in_background, brains, user, run_log
):
    chat, child = paying_in_background
    brains.script("You are PAYER.", "I may not pay Bob.")
    brains.script("You are LEAD.", "Bob was not paid.")

    child.deny("t1", by=user)
    settle_background()

    assert transcript(chat)[-1] == ("assistant", "Bob was not paid.")
    assert runs(run_log) == []


# -- cancelling a parent cancels its running children --------------------------------------------
def flags(*chats):
    pks = [chat.pk for chat in chats]
    values = dict(Chat.objects.filter(pk__in=pks).values_list("pk", "cancel_requested_at"))
    return [values[pk] is not None for pk in pks]


@pytest.mark.django_db
def test_cancel_flags_the_chat_and_its_queued_and_running_children(user):
    parent = Chat.objects.create(owner=user, state="running")
    queued, running, idle, waiting = (
        Chat.objects.create(owner=user, parent=parent, state=state)
        for state in ("queued", "running", "idle", "waiting")
    )

    with CaptureQueriesContext(connection) as captured:
        assert parent.cancel() is True

    # One UPDATE of the chat's flag (only if a run is there to cancel), one of its children's,
    # and the conditional one that applies a cancel at once to a chat waiting for a person
    # with no run to see it (none here: it runs). Savepoints are the test's transaction's.
    statements = [q["sql"].split()[0] for q in captured.captured_queries]
    assert [word for word in statements if word not in ("SAVEPOINT", "RELEASE")] == [
        "UPDATE", "UPDATE", "UPDATE",
    ]  # fmt: skip
    assert flags(parent, queued, running, idle, waiting) == [True, True, True, False, False]


@pytest.mark.django_db
def test_cancel_keeps_an_earlier_request_time_of_a_child(user):
    parent = Chat.objects.create(owner=user, state="running")
    earlier = timezone.now() - timedelta(minutes=5)
    child = Chat.objects.create(
        owner=user, parent=parent, state="running", cancel_requested_at=earlier
    )

    parent.cancel()

    assert Chat.objects.get(pk=child.pk).cancel_requested_at == earlier


@pytest.mark.django_db
def test_a_run_that_stops_for_a_cancel_flags_children_running_by_then(scripted, user):
    # The admin's cancel action is a bulk UPDATE of the flag (no cascade); a child that
    # started running meanwhile is flagged when the parent's run records the cancel.
    parent = Chat.objects.create(model="scripted:test", owner=user).ask_later("Go")
    running = Chat.objects.create(owner=user, parent=parent, state="running")
    idle = Chat.objects.create(owner=user, parent=parent, state="idle")
    Chat.objects.filter(pk=parent.pk).update(cancel_requested_at=timezone.now())

    with pytest.raises(CancelledError):
        parent.step()

    assert flags(parent, running, idle) == [False, True, False]


@pytest.mark.django_db
def test_an_in_process_child_finishes_its_run_and_then_the_cancelled_parent_stops(brains, user):
    chat = Lead.create(owner=user)

    def cancel_the_parent(request):
        Chat.objects.get(pk=chat.pk).cancel()  # "stop", pressed while the child works
        return "At night."

    brains.script("You are LEAD.", tool_call("research", {"task": "Owls?", "topic": "owls"}))
    brains.script("You are RESEARCH.", cancel_the_parent)

    with pytest.raises(CancelledError):
        chat.ask("Tell me about owls")

    assert transcript(Chat.objects.get(parent=chat))[-1] == ("assistant", "At night.")
    assert transcript(chat)[-1] == ("tool", "At night.")
    assert len(brains.requests_of("You are LEAD.")) == 1


@pytest.fixture
def streaming_child(brains, user, settings):
    """A Lead chat run by workers, waiting on a Research child that streams a long answer.
    Returns the parent; the child is streaming when the fixture returns."""
    settings.AGENTLOOP = EMBEDDED
    streaming = threading.Event()

    def long_story(request):
        streaming.set()
        return stream(*[f"w{i} " for i in range(600)], delay=0.05)

    brains.script("You are LEAD.", tool_call("research", {"task": "All of it", "topic": "owls"}))
    brains.script("You are RESEARCH.", long_story)
    chat = Lead.create(owner=user)
    chat.ask_later("Everything about owls").complete_later()
    assert streaming.wait(timeout=30)
    # The child's job may start before the parent's job has let go of the parent.
    eventually(lambda: Chat.objects.filter(pk=chat.pk, state="waiting", lease_token="").exists())
    return chat


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_waiting_parent_stops_its_child_running_in_the_background(
    streaming_child, user
):
    Chat.objects.get(pk=streaming_child.pk).cancel()
    settle_background()

    child = Chat.objects.get(parent=streaming_child)
    (partial,) = child.messages.filter(role="assistant")
    assert partial.status == MessageStatus.CANCELLED
    assert [(u.status, u.owner) for u in child.usage_records.all()] == [("cancelled", user)]
    assert child.state == "idle"


@pytest.mark.django_db(transaction=True)
def test_a_parent_cancelled_while_its_child_runs_is_usable_again(streaming_child, brains):
    Chat.objects.get(pk=streaming_child.pk).cancel()
    settle_background()
    brains.script("You are LEAD.", "Starting over.")

    chat = Chat.objects.get(pk=streaming_child.pk)
    answer = chat.ask("Never mind, start over")

    (result,) = chat.messages.filter(role="tool")
    assert (result.content, result.is_error) == (SUBAGENT_CANCELLED_RESULT, True)
    assert answer.content == "Starting over."
    assert (chat.state, chat.cancel_requested_at) == ("idle", None)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_child_gives_its_parent_an_error_result_and_the_parent_goes_on(
    streaming_child, brains
):
    brains.script("You are LEAD.", "Research was cancelled; here is what I know.")

    Chat.objects.get(parent=streaming_child).cancel()
    settle_background()

    chat = Chat.objects.get(pk=streaming_child.pk)
    assert transcript(chat)[-2:] == [
        ("tool", SUBAGENT_CANCELLED_RESULT),
        ("assistant", "Research was cancelled; here is what I know."),
    ]
    assert chat.state == "idle"
