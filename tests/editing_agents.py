"""For the editing tests, importable by path so a persisted chat (and a Celery worker)
rebuilds them: agents on the ``rules`` model (tests/worker_provider.py), an office whose clerk
subagent waits for a deferred result (the tests stop it by editing the office's message);
and an input guardrail an edited message must pass too."""

from __future__ import annotations

from typing import Any

from agentloop import Agent
from agentloop.guardrails import PASS, Block, input_guardrail
from tests.control_tools import ask_accounting


@input_guardrail
def no_passwords(context: Any) -> Any:
    """Blocks a message that shares a password."""
    return Block("the message shares a password") if "password" in context.text else PASS


class Clerk(Agent):
    """Looks an invoice up with accounting; the answer comes back later (it waits)."""

    model = "rules:test"
    instructions = "You are CLERK."
    tools = [ask_accounting]


class Office(Agent):
    """Hands invoices to the clerk."""

    model = "rules:test"
    instructions = "You are OFFICE."
    tools = [Clerk]
