"""What the two stream protocols share: a chat's live events, told to a protocol's translator.

A :class:`Translator` is what ``agentloop.web._live.RunFollower`` drives: it takes the events
of ``agentloop.live_events`` (saved ``message`` rows, streamed ``chunk``, ``tool_call_delta``
and ``partial_output`` pieces, ``partial`` answers of the database backend) and returns the
protocol's parts, as dicts. This base dispatches each kind of event once, and keeps what
every protocol remembers (the rows sent, the calls shown, the calls a cancel kept from
running); a protocol says how each piece is written (``UIStreamTranslator`` in
``agentloop.web._ui_protocol``, ``AgUiTranslator`` in ``agentloop.web._ag_ui``). Pure: no
database, no request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["Chunk", "Translator"]

#: one part of a stream: {"type": "text-delta", "id": ..., "delta": ...}.
Chunk = dict[str, Any]


class Translator(ABC):
    """One chat's live events as one protocol's parts (one stream, one reader)."""

    def __init__(self) -> None:
        #: pks of the message rows sent (or known to the page already).
        self.sent_rows: set[int] = set()
        #: ``ToolCall`` pk -> the toolCallId the page knows the call by.
        self.calls: dict[int, str] = {}
        #: a saved answer of this stream was cancelled, or calls were (``cancel_calls``).
        self.cancelled = False
        #: ``ToolCall`` pk -> toolCallId of the calls a cancel kept from running, in the
        #: order their parts were sent.
        self.cancelled_calls: dict[int, str] = {}

    def know(self, payload: dict[str, Any]) -> None:
        """Note a message row (``row_payload``) the page holds already."""
        self.sent_rows.add(payload["id"])
        for call in payload.get("tool_calls") or []:
            self.calls[call["id"]] = call["call_id"]

    def event(self, event: dict[str, Any]) -> list[Chunk]:
        """The parts of one live event (``{"type": ..., "data": {...}}``); [] for others."""
        data = event.get("data") or {}
        kind = event.get("type")
        if kind == "chunk":
            return self._text(str(data.get("text") or ""))
        if kind == "partial":
            return self._partial(data)
        if kind == "tool_call_delta":
            return self._tool_delta(data)
        if kind == "partial_output":
            return self._partial_output(data.get("value"))
        if kind == "message" and data.get("role") == "assistant":
            return self._saved_answer(data)
        if kind == "message" and data.get("role") == "tool":
            return self._result(data)
        if kind == "message" and "id" in data:
            self.sent_rows.add(data["id"])  # a user or summary row: not part of an answer
        return []

    def cancel_calls(self, call_pks: list[int]) -> list[Chunk]:
        """A part for each shown call a cancel kept from running (``ToolCall`` pks with
        state ``cancelled`` and no result row), once; the run then ends as cancelled."""
        out: list[Chunk] = []
        for pk in call_pks:
            tool_call_id = self.calls.get(pk)
            if tool_call_id is None or pk in self.cancelled_calls:
                continue
            self.cancelled_calls[pk] = tool_call_id
            self.cancelled = True
            out.append(self._cancelled_call(pk, tool_call_id))
        return out

    @abstractmethod
    def pending(self, calls: list[dict[str, Any]]) -> list[Chunk]:
        """The parts of the calls waiting for a person."""

    @abstractmethod
    def end(self, state: str, error: str = "", stop_reason: str = "") -> list[Chunk]:
        """The last parts of a run over in ``state``."""

    # -- the streaming answer: a protocol's pieces ------------------------------------------
    @abstractmethod
    def _open(self, out: list[Chunk]) -> Any:
        """The answer streaming now (opened, its opening parts added to ``out``, when none
        is): an object with ``tools``, delta index -> toolCallId."""

    @abstractmethod
    def _text(self, text: str) -> list[Chunk]:
        """A piece of the answer's text."""

    @abstractmethod
    def _partial(self, data: dict[str, Any]) -> list[Chunk]:
        """The database backend's answer so far (a ``partial`` event's data)."""

    def _partial_output(self, value: Any) -> list[Chunk]:
        """A structured answer's output so far (none: the protocol has no part for it)."""
        return []

    def _tool_delta(self, data: dict[str, Any]) -> list[Chunk]:
        """A piece of a streamed call: its start (once its id and name have come), then its
        arguments' text."""
        out: list[Chunk] = []
        index = int(data.get("index") or 0)
        answer = self._open(out)
        tool_call_id = answer.tools.get(index)
        if tool_call_id is None:
            if not data.get("id") or not data.get("name"):
                return out  # a piece before the call's id and name: nothing to show yet
            tool_call_id = answer.tools[index] = str(data["id"])
            out.append(self._tool_start(answer, tool_call_id, str(data["name"])))
        if data.get("arguments"):
            out.append(self._tool_arguments(tool_call_id, str(data["arguments"])))
        return out

    @abstractmethod
    def _tool_start(self, answer: Any, tool_call_id: str, name: str) -> Chunk:
        """The part that starts a streamed call of the answer streaming now."""

    @abstractmethod
    def _tool_arguments(self, tool_call_id: str, text: str) -> Chunk:
        """The part carrying a piece of a streamed call's arguments."""

    # -- saved rows -------------------------------------------------------------------------
    @abstractmethod
    def _saved_answer(self, data: dict[str, Any]) -> list[Chunk]:
        """A saved answer (a ``message`` event's data): it closes, or replaces, what
        streamed of it."""

    def _result(self, data: dict[str, Any]) -> list[Chunk]:
        """A tool result, once, for a call the page was shown."""
        if data["id"] in self.sent_rows:
            return []
        self.sent_rows.add(data["id"])
        tool_call_id = self.calls.get(data.get("tool_call_id"))  # type: ignore[arg-type]
        if tool_call_id is None:
            return []  # the result of a call the page was never shown
        return [self._result_part(tool_call_id, data)]

    @abstractmethod
    def _result_part(self, tool_call_id: str, data: dict[str, Any]) -> Chunk:
        """The part of a shown call's result row."""

    @abstractmethod
    def _cancelled_call(self, pk: int, tool_call_id: str) -> Chunk:
        """The part of a shown call a cancel kept from running."""
