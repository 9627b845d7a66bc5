"""Tools for the control tests (halts, limits, deferred results), importable by path."""

from __future__ import annotations

from pydantic import BaseModel

from agentloop import Tool, tool
from tests.processes import run_script


class Guard(Tool):
    """Checks a payment; halts the chat when it is over budget."""

    class Params(BaseModel):
        amount: int

    def execute(self, amount: int) -> str:
        if amount > 100:
            self.context.halt(f"amount {amount} is over budget")
            return "over budget: refused"
        return "within budget"


class HaltFromAnotherProcess(Tool):
    """Asks another process to halt this chat, and waits for it to have done so."""

    def execute(self) -> str:
        spec = '{"verb": "halt", "reason": "operator stop"}'
        done = run_script("drive_chat.py", self.context.chat.pk, spec)
        return done.stdout.splitlines()[-2] if done.returncode == 0 else done.stderr[-300:]


@tool(deferred=True)
def ask_accounting(invoice: str) -> str:
    """Asks the accounting system about an invoice; its answer comes back by webhook."""
    raise AssertionError("agentloop never runs a deferred tool")


class OperatorCheck(Tool):
    """Has a human operator check an order; the operator's system submits the outcome."""

    deferred = True

    class Params(BaseModel):
        order: str

    def execute(self, order: str) -> str:
        raise AssertionError("agentloop never runs a deferred tool")
