"""Typed uses of agentloop's public API: mypy must find no error here (tests/test_typing.py).

``assert_type`` is checked by mypy and does nothing at run time; this file is never run by
the suite, only type-checked (importing it would make tools and call no model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_type

import agentloop
from agentloop import Message, tool
from agentloop.engine import Conversation
from agentloop.models import AbstractMessage, Chat
from agentloop.streaming import (
    AsyncEventStream,
    EventStream,
    FinalMessageEvent,
    StreamEvent,
    TextDeltaEvent,
    ToolResultEvent,
)
from agentloop.tools import FunctionTool


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool(name="charge", idempotent=False, requires_approval=True)
def charge_card(amount: int) -> str:
    """Charges the card."""
    return f"charged {amount}"


assert_type(add, type[FunctionTool])
assert_type(charge_card, type[FunctionTool])
assert_type(tool(name="x"), Callable[[Callable[..., Any]], type[FunctionTool]])


def in_memory() -> None:
    chat = agentloop.chat("offline:any", tools=[add])
    assert_type(chat, Conversation[Message])
    assert_type(chat.with_tools(charge_card), Conversation[Message])
    answer = chat.ask("What is 2 + 3?")
    assert_type(answer, Message)
    assert_type(answer.content, str)
    assert_type(chat.step(), Message | None)
    assert_type(chat.run_tools(), list[Message])
    assert_type(chat.complete(), Message)


def persisted() -> None:
    chat = Chat(model="offline:any")
    chat.with_tools(add)
    assert_type(chat.ask("Hi").content, str)
    assert_type(chat.ask("Hi"), AbstractMessage)
    assert_type(chat.step(), AbstractMessage | None)


async def in_memory_async() -> None:
    chat = agentloop.chat("offline:any", tools=[add])
    assert_type(await chat.aask("What is 2 + 3?"), Message)
    assert_type(await chat.astep(), Message | None)
    assert_type(await chat.arun_tools(), list[Message])
    assert_type(await chat.acomplete(), Message)


async def persisted_async() -> None:
    chat = Chat(model="offline:any")
    assert_type(await chat.aask("Hi"), AbstractMessage)
    assert_type(await chat.astep(), AbstractMessage | None)
    assert_type(await chat.acomplete(), AbstractMessage)


def streams() -> None:
    chat = agentloop.chat("offline:any", tools=[add])
    events = chat.stream("What is 2 + 3?")
    assert_type(events, EventStream[Message])
    for event in events:
        assert_type(event, StreamEvent[Message])
        if isinstance(event, TextDeltaEvent):
            assert_type(event.text, str)
        elif isinstance(event, ToolResultEvent):
            assert_type(event.message, Message)
        elif isinstance(event, FinalMessageEvent):
            assert_type(event.message, Message)
    assert_type(events.result, Message | None)
    assert_type(chat.stream(), EventStream[Message])
    persisted = Chat(model="offline:any")
    assert_type(persisted.stream("Hi"), EventStream[AbstractMessage])


async def async_streams() -> None:
    chat = agentloop.chat("offline:any")
    events = chat.astream("Hi")
    assert_type(events, AsyncEventStream[Message])
    async with events:
        async for event in events:
            assert_type(event, StreamEvent[Message])
    assert_type(Chat(model="offline:any").astream(), AsyncEventStream[AbstractMessage])
