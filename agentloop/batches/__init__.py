"""Batches: the next model call of many chats as one provider batch (docs/design.md §8).

``submit(chats)`` (``agentloop.batch``) builds each chat's request exactly as ``generate()``
would (``Conversation.prepare_model_call``), sends them as one batch and records it as a
:class:`~agentloop.models.Batch` with one :class:`~agentloop.models.BatchItem` per chat.
``poll()`` (the ``agentloop.poll_batches`` task, ``manage.py agentloop batches``) refreshes
every open batch; once the provider has ended one, each answer is appended to its chat as
``generate()`` appends it (``Conversation.accept_response``: same message rows, callbacks,
signals, a usage row priced at the batch price). Then, per chat:

- an answer that asks for tools: the tools run here (``run_tools()``), and the chat goes
  into the next batch (``auto_continue=True``) or back to the normal loop
  (``complete_later()``);
- a failed request: a failed usage row, and the chat is marked failed with the error;
- a chat cancelled while its request waited: it is released at the next poll (the cancel is
  recorded as usual) and its answer, when it comes, is only accounted for, never appended;
- a chat that moved on meanwhile (another answer came first): the answer is discarded.

Writes to a chat happen under its lease (one writer per chat), and each item moves out of
``pending`` with a conditional UPDATE in the transaction that writes its outcome, so two
pollers never append the same answer twice.

The modules: :mod:`.submitting` (``submit``: checks, records and sends a batch),
:mod:`.polling` (``poll``, ``refresh``, ``cancel``: collecting the results into the chats)
and :mod:`.records` (the batch's rows: counts, single UPDATEs, the poller's claim).
"""

from __future__ import annotations

from .polling import cancel, poll, refresh
from .records import CLAIM_SECONDS
from .submitting import submit

__all__ = ["CLAIM_SECONDS", "cancel", "poll", "refresh", "submit"]
