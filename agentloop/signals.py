"""Signals sent by persisted chats; they mirror the engine's callbacks.

Each is sent with ``sender`` = the chat model class and ``chat`` = the instance.
"""

from django.dispatch import Signal

__all__ = [
    "budget_exceeded",
    "chat_cancelled",
    "chat_forked",
    "chat_halted",
    "chat_handed_off",
    "chat_stopped",
    "guardrail_blocked",
    "message_added",
    "messages_superseded",
    "model_call_started",
    "model_fallback",
    "tool_call_finished",
    "tool_call_started",
]

model_call_started = Signal()
"""Before each model call (``before_message``)."""

message_added = Signal()
"""A message was saved: ``message`` (``after_message``)."""

tool_call_started = Signal()
"""A tool is about to run: ``tool_call`` (``before_tool_call``)."""

tool_call_finished = Signal()
"""A tool result was saved: ``message`` (``after_tool_result``)."""

chat_cancelled = Signal()
"""A run stopped at a checkpoint because cancel() was requested."""

chat_stopped = Signal()
"""A limit or a guardrail's block stopped the turn: ``reason``."""

guardrail_blocked = Signal()
"""A guardrail blocked a user message, an answer or a tool call: ``outcome`` (its
``GuardrailOutcome``: guardrail, stage, reason) and ``stops`` (the chat stops for it)."""

model_fallback = Signal()
"""A model call failed in a way retrying can't fix and the step tries the next model
(``with_fallbacks``); args: chat, from_model, to_model, error."""

chat_halted = Signal()
"""``Halt(reason)`` stopped the run before a model call: ``reason`` (as given)."""

chat_handed_off = Signal()
"""A tool call handed the chat over to another agent (``Agent.as_handoff``,
``ToolContext.hand_off``), committed: ``from_agent``, ``to_agent`` (import paths; "" for
a chat that had no agent), ``inputs``, ``tool_call`` (the call's row)."""

budget_exceeded = Signal()
"""A budget or quota of the chat's subject had no room for its next model call; the chat is
stopped (``chat_stopped`` is sent too): ``reason`` (the chat's ``stop_reason``),
``subject`` (as shown, "owner 42") and ``limit`` ("cost_per_day", "chats_in_flight"...)."""

messages_superseded = Signal()
"""An edit or a regenerated answer superseded messages (kept, never sent again):
``message_ids`` (in order) and ``tool_call_ids`` (the provider ids of the calls among them
that had no result: they never run). The replacement comes next, as ``message_added``."""

chat_forked = Signal()
"""``Chat.fork(at=...)`` made a new chat: ``fork`` (the new chat) and ``message`` (the
message of ``chat`` it was forked at)."""
