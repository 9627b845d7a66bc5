"""Tools for the control tests (halts, limits, deferred results), importable by path."""

from __future__ import annotations

from pydantic import BaseModel

from agentloop import Tool
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
