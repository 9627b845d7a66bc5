"""Editing a conversation: ``fork``, ``regenerate`` and ``edit`` (a part of ``Conversation``).

The transcript is ordinary rows, so editing is visible in them: an edit or a regenerated
answer marks the replaced rows superseded (kept, with their usage rows, never sent again)
and adds the new user message at the end; a fork is a new chat holding copies of the rows
up to a message. See docs/editing.md for what happens to pending tool calls, approvals and
subagents under each verb.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..exceptions import ChatBusyError, ConfigurationError, EditError
from ..messages import Message, MessageStatus
from . import tracing
from .callbacks import Callbacks
from .effects import Effects
from .loop import Loop, checked_attachments
from .runs import Run, Runs
from .store import SUPERSEDED_DECISION, ChatStore, Edits, missing_part
from .streaming import StreamCallback
from .transcript_reading import next_move

__all__ = ["FORK_OPEN_CALL_RESULT", "KEEP", "SUPERSEDED_DECISION", "Editing"]

#: the result a fork gives a copied call whose result was not copied: it never runs there.
FORK_OPEN_CALL_RESULT = "Not run: the conversation was forked before this call had a result."


class _Keep:
    """``attachments=KEEP``: the edited message keeps the attachments it had."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


def _key_of(message: Any) -> Any:
    """The store key ``message`` names: a store record (``pk``), a Message (``key``), or a
    key itself."""
    if isinstance(message, Message):
        return message.key
    return getattr(message, "pk", message)


def _same(key: Any, other: Any) -> bool:
    return key == other or (key is not None and str(key) == str(other))


class Editing:
    """One chat's edits and forks, over its runs (the claim) and its loop (the answer)."""

    def __init__(self, store: ChatStore, callbacks: Callbacks, runs: Runs, loop: Loop) -> None:
        self.store = store
        self._emit = callbacks.emit
        self._runs = runs
        self._loop = loop

    # -- fork -----------------------------------------------------------------------------
    def fork(self, at: Any, wrap: Callable[[ChatStore], Any]) -> Any:
        """The new chat (``wrap`` makes a Conversation of a store the store returned)."""
        forks = self.store.forks
        if forks is None:
            raise ConfigurationError(missing_part(self.store, "forks", "no fork"))
        transcript = self.store.transcript.load_transcript()
        if at is None:
            finished = [m for m in transcript if m.status != MessageStatus.PARTIAL]
            if not finished:
                raise EditError("Nothing to fork: the chat has no messages yet.")
            target = finished[-1]
        else:
            target = self._find(transcript, at)
            if target.status == MessageStatus.PARTIAL:
                raise EditError(
                    f"Message {target.key} is an answer still streaming: fork at a finished one."
                )
        forked = forks.fork(target, FORK_OPEN_CALL_RESULT)
        if isinstance(forked, ChatStore):
            forked = wrap(forked)
        self._emit("forked", forked, self.store.transcript.native_message(target))
        return forked

    # -- regenerate and edit --------------------------------------------------------------
    def checked(self, text: Any, attachments: Any) -> list[Any] | None:
        """An edit's input checked before anything is taken or written: the attachments to
        send (None: keep the original's)."""
        if not isinstance(text, str):
            raise EditError(
                f"An edited message's text must be a string, not {type(text).__name__}."
            )
        return None if attachments is KEEP else checked_attachments(attachments)

    def replacing(
        self,
        message: Any,
        text: str | None,
        files: list[Any] | None,
        stream: StreamCallback | None,
    ) -> Effects[Any]:
        """``edit()`` and ``regenerate()``: the replacement written, then answered here."""
        self._edits()  # refused before anything is taken or written
        with self._runs.scope(single=False) as run:
            self._replace(run, message, text, files)
            return (yield from self._loop.finish(run, stream))

    def replace_later(self, message: Any, text: str | None, files: list[Any] | None) -> None:
        """``edit_later()`` and ``regenerate_later()``: the replacement written, no model call."""
        self._edits()  # refused before anything is taken or written
        with self._runs.scope(single=True) as run:
            self._replace(run, message, text, files)

    # -- internals --------------------------------------------------------------------------
    def _edits(self) -> Edits:
        """The store's edits part; a clear refusal where the store leaves it out."""
        if self.store.edits is None:
            raise ConfigurationError(missing_part(self.store, "edits", "no edit or regenerate"))
        return self.store.edits

    def _replace(self, run: Run, message: Any, text: str | None, files: list[Any] | None) -> None:
        """Under the verb's claim: supersede from the named user message (the last one when
        None) and add its replacement as the new turn (``files``: its attachments; None:
        the original's); the run goes on with the kept rows and the replacement."""
        transcript = self.store.transcript.load_transcript()
        pending = self._edits().pending_run()
        if pending:
            raise ChatBusyError(
                f"This chat {pending}: cancel() it, or wait for it to end, before editing "
                "or regenerating."
            )
        target = self._target(transcript, message)
        replacement = Message(
            role="user",
            content=target.content if text is None else text,
            attachments=target.attachments if files is None else files,
        )
        if not replacement.content.strip() and not replacement.attachments:
            raise EditError("An edited message needs some text (or an attachment).")
        start = next(i for i, m in enumerate(transcript) if m.key == target.key)
        superseded = self._edits().supersede(target)
        record = self.store.transcript.append_message(replacement)
        tracing.turn_started(self.store, replacement)
        kept = transcript[:start] + [m for m in transcript[start:] if m.role == "system"]
        run.transcript = [*kept, replacement]
        run.next_move = next_move(run.transcript)
        self._emit("superseded", superseded)
        self._emit("after_message", record)

    def _target(self, transcript: list[Message], message: Any) -> Message:
        if message is None:
            users = [m for m in transcript if m.role == "user"]
            if not users:
                raise EditError("Nothing to regenerate: the chat has no user message yet.")
            return users[-1]
        target = self._find(transcript, message)
        if target.role != "user":
            raise EditError(
                f"Message {target.key} is a {target.role} message: only a user message can be "
                "edited (regenerate() gives the last one a new answer)."
            )
        return target

    def _find(self, transcript: list[Message], message: Any) -> Message:
        """The current message ``message`` names; ``EditError`` saying why when none."""
        key = _key_of(message)
        for candidate in transcript:
            if _same(candidate.key, key):
                return candidate
        if any(m.superseded and _same(m.key, key) for m in self._edits().load_history()):
            raise EditError(
                f"Message {key} was superseded (an edit or a regenerated answer replaced it): "
                "name one of the chat's current messages."
            )
        raise EditError(f"No message {key!r} in this chat.")
