"""The demo agent's tools: a safe calculator, made-up weather, and notes kept in the database."""

from __future__ import annotations

import ast
import hashlib
import math
import operator
from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from pydantic import BaseModel, Field

from agentloop import Tool, ToolError, tool
from agentloop.models import Chat
from example_project.models import Note

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_LENGTH = 200
#: powers whose result would need more bits than this are refused (9 ** 9 ** 9 would hang).
_MAX_BITS = 4096


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, + - * / **, parentheses, unary minus.

    The expression is parsed with :mod:`ast` and only those nodes are evaluated:
    names, calls, attributes and everything else are refused with a ToolError.
    """
    if len(expression) > _MAX_LENGTH:
        raise ToolError(f"The expression is too long (at most {_MAX_LENGTH} characters).")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"Not an arithmetic expression: {expression!r}") from exc
    try:
        return _evaluate(tree.body)
    except ZeroDivisionError as exc:
        raise ToolError("Division by zero.") from exc
    except OverflowError as exc:
        raise ToolError("The result is too large.") from exc


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value  # type(...) in: bool is an int subclass, and True is not a number
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if (
            isinstance(node.op, ast.Pow)
            and abs(left) > 1
            and right * math.log2(abs(left)) > _MAX_BITS
        ):
            raise ToolError("The result is too large.")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex):  # a negative number to a fractional power
            raise ToolError("The result is not a real number.")
        return result
    raise ToolError(
        f"Unsupported in an arithmetic expression: {ast.unparse(node)!r} "
        "(only numbers, + - * / ** and parentheses)."
    )


def _format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}" if isinstance(value, float) else str(value)


@tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression exactly.

    Args:
        expression: Numbers with + - * / ** and parentheses, e.g. "(12 + 30) * 2".
    """
    return _format_number(evaluate(expression))


class Weather(Tool):
    """Gets the current weather for a city (made-up demo data, not a real forecast)."""

    class Params(BaseModel):
        city: str = Field(description="City name, e.g. Paris")

    def execute(self, city: str) -> dict[str, Any]:
        # Derived from the name, so a city always gets the same weather, on any machine.
        seed = hashlib.sha256(city.strip().lower().encode()).digest()
        skies = ["sunny", "partly cloudy", "overcast", "light rain", "windy", "foggy"]
        return {
            "city": city.strip(),
            "temperature_c": seed[0] % 30 - 2,
            "conditions": skies[seed[1] % len(skies)],
            "source": "made-up demo data, not a real forecast",
        }


def _persisted_chat(tool: Tool) -> Chat:
    """The Chat row the tool runs in (an in-memory chat has none to keep notes with)."""
    chat = tool.context.chat
    if not isinstance(chat, Chat):
        raise ToolError("Notes are kept in the database: they need a persisted chat.")
    return chat


def _notes_of(chat: Chat) -> QuerySet[Note]:
    """A user's notes follow them from chat to chat; a chat without owner keeps its own."""
    if chat.owner_id is not None:
        return Note.objects.filter(owner_id=chat.owner_id)
    return Note.objects.filter(chat=chat, owner__isnull=True)


class SaveNote(Tool):
    """Saves a short note for the user, to be listed later with list_notes."""

    # The note commits with the call's result, or neither does: saved exactly once, whatever
    # crashes (docs/transactional-tools.md).
    transactional = True

    class Params(BaseModel):
        text: str = Field(description="The note, one sentence", min_length=1, max_length=500)

    def execute(self, text: str) -> str:
        chat = _persisted_chat(self)
        note = Note.objects.create(chat=chat, owner_id=chat.owner_id, text=text.strip())
        return f"Saved note #{note.pk}: {note.text}"


class ListNotes(Tool):
    """Lists the notes saved so far, oldest first."""

    def execute(self) -> dict[str, Any]:
        notes = list(_notes_of(_persisted_chat(self)).values_list("text", flat=True))
        return {"count": len(notes), "notes": notes}


class DeleteNotes(Tool):
    """Deletes all of the user's notes. Runs only once the user approves it."""

    requires_approval = True
    transactional = True

    def execute(self) -> str:
        deleted, _ = _notes_of(_persisted_chat(self)).delete()
        return f"Deleted {deleted} note{'' if deleted == 1 else 's'}."
