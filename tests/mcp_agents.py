"""The agents tests/test_mcp_serve.py serves over MCP, on the "rules" model
(tests/worker_provider.py), so the server process answers the same as the test would: the
task's first word is the rule (``tools:step_one|step_two``, ``tools:publish``, a long run
of ``nap`` calls).
"""

from __future__ import annotations

import time

from agentloop import Agent, tool
from tests.tools import step_one, step_two


@tool(requires_approval=True)
def publish() -> str:
    """Publishes the report; waits for a person's approval."""
    return "published"


@tool
def nap() -> str:
    """Takes a short nap (a long run is many of them: "tools:nap|nap|...")."""
    time.sleep(0.1)
    return "rested"


class Reporter(Agent):
    """Writes a report on a topic; it may publish it (a person approves that)."""

    model = "rules:test"
    instructions = "You report on {topic}."
    inputs = {"topic": "What the report is about."}
    tools = [step_one, step_two, publish, nap]


class Hidden(Agent):
    """An agent the tests never expose."""

    model = "rules:test"
