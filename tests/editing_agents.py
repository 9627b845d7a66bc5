"""Agents on the ``rules`` model (tests/worker_provider.py), importable by path so a Celery
worker rebuilds them: an office whose clerk subagent waits for a deferred result (the
editing tests stop it by editing the office's message)."""

from __future__ import annotations

from agentloop import Agent
from tests.control_tools import ask_accounting


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
