"""Editing a conversation: ``fork``, ``regenerate`` and ``edit`` (a part of ``Conversation``).

The transcript is ordinary rows, so editing is visible in them: an edit or a regenerated
answer marks the replaced rows superseded (kept, with their usage rows, never sent again)
and adds the new user message at the end; a fork is a new chat holding copies of the rows
up to a message. See docs/editing.md for what happens to pending tool calls, approvals and
subagents under each verb.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, Self

from ..exceptions import ChatBusyError, EditError
from ..messages import Message, MessageStatus
from . import tracing
from .drivers import drive, drive_async
from .effects import Effects
from .store import ChatStore
from .streaming import StreamCallback
from .transcript import next_move

__all__ = ["FORK_OPEN_CALL_RESULT", "KEEP", "SUPERSEDED_DECISION", "Editing"]

#: the result a fork gives a copied call whose result was not copied: it never runs there.
FORK_OPEN_CALL_RESULT = "Not run: the conversation was forked before this call had a result."
#: the decision recorded on a call held for a person or a subagent when it was superseded.
SUPERSEDED_DECISION = "superseded"


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
    """``fork``, ``regenerate``, ``edit`` and their ``_later`` and async forms."""

    store: ChatStore
    _run: Callable[..., AbstractContextManager[Any]]
    _complete: Callable[[Any, StreamCallback | None], Effects[Any]]
    _emit: Callable[..., None]
    _attachments: Callable[[Any], list[Any]]

    # -- fork -----------------------------------------------------------------------------
    def fork(self, at: Any = None) -> Any:
        """A new chat with this one's configuration, tools and owner and copies of its
        messages up to and including ``at`` (a message, its record or key; None: the
        latest), linked to this chat and that message. Usage rows stay with this chat.

        A call whose result comes after ``at`` is copied with the error result "Not run: the
        conversation was forked before this call had a result." (so the fork never repeats
        a tool its origin may have run). Writes nothing here, so a chat that is running can
        be forked. Returns the new chat: a ``Chat`` for a persisted chat, a
        ``Conversation`` in memory (callbacks are not copied)."""
        transcript = self.store.load_transcript()
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
        forked = self.store.fork(target, FORK_OPEN_CALL_RESULT)
        if isinstance(forked, ChatStore):
            forked = type(self)(forked)  # type: ignore[call-arg]  # Conversation(store)
        self._emit("forked", forked, self.store.native_message(target))
        return forked

    async def afork(self, at: Any = None) -> Any:
        """``fork()`` for async code."""
        return await self.store.run_phase(partial(self.fork, at))

    # -- regenerate and edit --------------------------------------------------------------
    def regenerate(self, stream: StreamCallback | None = None) -> Any:
        """A new answer to the last user message, run here: that message is asked again (a
        copy of it starts a new turn, with fresh limits) and it and every row after it are
        marked superseded: kept, with their usage rows, never sent again. Calls among them
        that had no result are cancelled and never run (a subagent they wait for is
        stopped). Returns the new answer. ``ChatBusyError`` while a run holds the chat or is
        queued for it (cancel it first); ``EditError`` when there is no user message."""
        return drive(self._replacing(None, None, None, stream), self.store)

    def regenerate_later(self) -> Self:
        """``regenerate()`` without the model call: the last user message is asked again
        and the replaced rows superseded; ``complete_later()`` (or ``complete()``) answers it."""
        with self._run(single=True) as run:
            self._replace(run, None, None, None)
        return self

    def edit(
        self,
        message: Any,
        text: str,
        stream: StreamCallback | None = None,
        *,
        attachments: Any = KEEP,
    ) -> Any:
        """Replace a user message (a record, a Message or its key) with ``text`` and run
        from there: it and every row after it are superseded (kept, never sent again), the
        edited message is added as a new turn and answered here. ``attachments`` default to
        the original's (None or [] for none). Returns the answer. The same refusals as
        ``regenerate()``, and ``EditError`` for a message that isn't a current user message."""
        files = self._checked(text, attachments)
        return drive(self._replacing(message, text, files, stream), self.store)

    def edit_later(self, message: Any, text: str, *, attachments: Any = KEEP) -> Self:
        """``edit()`` without the model call; ``complete_later()`` answers it."""
        files = self._checked(text, attachments)
        with self._run(single=True) as run:
            self._replace(run, message, text, files)
        return self

    async def aregenerate(self, stream: StreamCallback | None = None) -> Any:
        """``regenerate()`` for async code."""
        return await drive_async(self._replacing(None, None, None, stream), self.store)

    async def aregenerate_later(self) -> Self:
        """``regenerate_later()`` for async code."""
        await self.store.run_phase(self.regenerate_later)
        return self

    async def aedit(
        self,
        message: Any,
        text: str,
        stream: StreamCallback | None = None,
        *,
        attachments: Any = KEEP,
    ) -> Any:
        """``edit()`` for async code."""
        files = self._checked(text, attachments)
        return await drive_async(self._replacing(message, text, files, stream), self.store)

    async def aedit_later(self, message: Any, text: str, *, attachments: Any = KEEP) -> Self:
        """``edit_later()`` for async code."""
        await self.store.run_phase(partial(self.edit_later, message, text, attachments=attachments))
        return self

    # -- internals --------------------------------------------------------------------------
    def _checked(self, text: Any, attachments: Any) -> list[Any] | None:
        """An edit's input checked before anything is taken or written: the attachments to
        send (None: keep the original's)."""
        if not isinstance(text, str):
            raise EditError(
                f"An edited message's text must be a string, not {type(text).__name__}."
            )
        return None if attachments is KEEP else self._attachments(attachments)

    def _replacing(
        self,
        message: Any,
        text: str | None,
        files: list[Any] | None,
        stream: StreamCallback | None,
    ) -> Effects[Any]:
        with self._run(single=False) as run:
            self._replace(run, message, text, files)
            return (yield from self._complete(run, stream))

    def _replace(self, run: Any, message: Any, text: str | None, files: list[Any] | None) -> Any:
        """Under the verb's claim: supersede from the named user message (the last one when
        None) and add its replacement as the new turn (``files``: its attachments; None:
        the original's); the run goes on with the kept rows and the replacement."""
        transcript, _ = self.store.read_for_step()
        pending = self.store.pending_run()
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
        superseded = self.store.supersede(target)
        record = self.store.append_message(replacement)
        tracing.turn_started(self.store, replacement)
        kept = transcript[:start] + [m for m in transcript[start:] if m.role == "system"]
        run.transcript = [*kept, replacement]
        run.next_move = next_move(run.transcript)
        self._emit("superseded", superseded)
        self._emit("after_message", record)
        return record

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
        if any(m.superseded and _same(m.key, key) for m in self.store.load_history()):
            raise EditError(
                f"Message {key} was superseded (an edit or a regenerated answer replaced it): "
                "name one of the chat's current messages."
            )
        raise EditError(f"No message {key!r} in this chat.")
