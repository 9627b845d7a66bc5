"""Agents that hand a support conversation to each other (tests/test_handoffs*.py), importable
by path so persisted chats rebuild them in any process (a Celery worker too).

Each agent names its own model on the ``scripted`` provider, so a request shows which agent
made it: the test's ScriptedProvider answers in this process, the ``rules`` provider
(tests/worker_provider.py) in a worker started with ``PROVIDERS=WORKER_PROVIDERS``.
"""

from __future__ import annotations

from pydantic import BaseModel

from agentloop import Agent, Tool, tool

PROVIDER = "scripted"
#: a worker's AGENTLOOP["PROVIDERS"]: "scripted:<agent>" answered by the rules.
WORKER_PROVIDERS = {
    "rules": {"class": "tests.worker_provider.RuleProvider"},
    "scripted": {"class": "tests.worker_provider.RuleProvider"},
}


@tool
def lookup_order(order: str) -> str:
    """Looks an order up."""
    return f"order {order}: 2 items, paid"


@tool
def invoice_total(order: str) -> str:
    """The invoice total of an order."""
    return f"invoice of {order}: 42 EUR"


class Triage(Agent):
    """Sorts out what a customer needs and hands them to the right team."""

    model = f"{PROVIDER}:triage"
    instructions = "You are TRIAGE for {customer}."
    inputs = {"customer": "Who is asking."}
    tools = [lookup_order]
    tool_options = {"choice": "required"}
    temperature = 0.1
    limits = {"max_tool_calls": 20}
    handoffs = ["tests.handoff_agents.Billing", "tests.handoff_agents.Refunds"]


class Billing(Agent):
    """Answers questions about invoices and payments."""

    model = f"{PROVIDER}:billing"
    instructions = "You are BILLING for {customer}."
    inputs = ["customer"]
    tools = [invoice_total]
    handoffs = [Triage]


class Refunds(Agent):
    """Refunds orders."""

    model = f"{PROVIDER}:refunds"
    instructions = "You are REFUNDS for {customer}, refunding order {order}."
    inputs = {"customer": "Who is asking.", "order": "The order to refund."}


class Plain(Agent):
    """Has no instructions of its own."""

    model = f"{PROVIDER}:plain"


class Unservable(Agent):
    """An agent on a model no provider serves."""

    model = "nowhere:model"
    instructions = "You are UNSERVABLE."


def _unstorable_tool() -> object:
    @tool
    def scratch() -> str:
        """A tool defined in a function: no import path a chat could store."""
        return "scratch"

    return scratch


class Sloppy(Agent):
    """An agent whose tool a persisted chat can't store (it fails halfway through)."""

    model = f"{PROVIDER}:sloppy"
    instructions = "You are SLOPPY."
    tools = [_unstorable_tool()]


class Escalate(Tool):
    """Escalates the case to billing (a tool that hands its chat over with ``find``)."""

    class Params(BaseModel):
        customer: str

    def execute(self, customer: str) -> str:
        Billing.find(self.context.chat.pk, customer=customer)
        return f"escalated for {customer}"


class EscalateInMemory(Tool):
    """Escalates an in-memory chat to billing through its context."""

    name = "escalate"

    def execute(self) -> str:
        self.context.hand_off(Billing)
        return "escalated"


class EscalateAndNote(Tool):
    """Notes the escalation in the database and hands the chat to billing, in one
    transaction with its result (a transactional tool)."""

    transactional = True

    def execute(self) -> str:
        from example_project.models import Note  # a model: imported once apps are loaded

        Note.objects.create(chat_id=self.context.chat.pk, text="escalated to billing")
        self.context.hand_off(Billing, customer="Ada")
        return "noted"
