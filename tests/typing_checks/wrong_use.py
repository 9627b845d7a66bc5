# ruff: noqa: B018 - expressions whose only point is the type error mypy reports
"""Wrong uses mypy must report (tests/test_typing.py expects exactly these errors, by line)."""

from __future__ import annotations

import agentloop
from agentloop import tool


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


answer = agentloop.chat("offline:any").ask("Hi")
answer.no_such_field  # error: the answer is a Message, not Any
count: int = agentloop.chat("offline:any").ask("Hi").content  # error: content is a str
add.no_such_attribute  # error: a tool class, not Any
