"""The tools a model calls to keep memories across chats: ``remember``, ``recall``,
``forget`` and ``update_working_memory``. Each reaches only the memories of the chat it runs
for (:class:`~._scope.MemoryScope`, a filter in each statement): what the model passes as
arguments never names a subject, an owner or an agent (unknown arguments are refused)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Subquery
from django.db.models.functions import Now

from ..embeddings import embed
from ..tools import ToolContext, tool
from ._scope import MemoryScope

__all__ = ["MEMORY_TOOLS", "forget", "recall", "remember", "update_working_memory"]

#: the longest memory, and the longest working memory, in characters.
MAX_MEMORY_CHARS = 2000
MAX_WORKING_MEMORY_CHARS = 8000


def _checked(text: str, limit: int, what: str) -> str:
    text = text.strip()
    if not text:
        raise ValueError(f"The {what} is empty: give the text to keep.")
    if len(text) > limit:
        raise ValueError(f"The {what} is {len(text)} characters; at most {limit} are kept.")
    return text


@tool
def remember(text: str, context: ToolContext) -> str:
    """Keep a fact about the user for later conversations (a preference, a name, a decision).

    Args:
        text: the fact, in one self-contained sentence.
    """
    chat = context.chat
    scope = MemoryScope.of_tool_chat(chat)
    text = _checked(text, MAX_MEMORY_CHARS, "memory")
    memories = scope.memories()
    # The call's id is its idempotency key: a round run again after a crash keeps one row.
    kept = memories.filter(metadata__tool_call=context.tool_call.id).first()
    if kept is not None:
        return f"Remembered (memory {kept.pk})."
    vector = embed(text, model=scope.model, chat=chat).vector
    row = memories.model(
        subject=scope.subject,
        agent=scope.agent,
        owner_id=scope.owner_id,
        text=text,
        metadata={"tool_call": context.tool_call.id},
        embedding=vector,
        embedding_model=scope.model,
    )
    if isinstance(chat, row._meta.get_field("chat").related_model):
        row.chat = chat
        key = context.tool_call.key
        if key is not None:
            # The answer that asked for it, read by the INSERT itself (no statement of its own).
            asking = chat.tool_calls.filter(pk=key).values("message_id")[:1]
            row.message_id = Subquery(asking)
    row.save()
    return f"Remembered (memory {row.pk})."


@tool
def recall(query: str, context: ToolContext, k: int = 5) -> list[dict[str, Any]]:
    """Search what was remembered about the user in earlier conversations, by meaning.

    Args:
        query: what to look for.
        k: how many memories at most (1 to 20).
    """
    scope = MemoryScope.of_tool_chat(context.chat)
    if not query.strip():
        raise ValueError("The query is empty: say what to look for.")
    k = max(1, min(int(k), 20))
    vector = embed(query, model=scope.model, chat=context.chat).vector
    return [
        {"id": memory.pk, "text": memory.text, "similarity": round(1.0 - memory.distance, 4)}
        for memory in scope.nearest(vector, k=k)
    ]


@tool
def forget(memory_id: int, context: ToolContext) -> str:
    """Forget one memory (its id, as remember or recall gave it).

    Args:
        memory_id: the memory's id.
    """
    scope = MemoryScope.of_tool_chat(context.chat)
    deleted, _ = scope.memories().filter(pk=memory_id).delete()
    if not deleted:
        # The same answer whether the id is another owner's or nobody's: nothing leaks.
        return f"There is no memory {memory_id} to forget."
    return f"Forgot memory {memory_id}."


@tool
def update_working_memory(text: str, context: ToolContext) -> str:
    """Replace your working memory (the notes about the user you keep up to date and get
    with your instructions in every conversation) with this text, whole.

    Args:
        text: the whole new working memory (keep what still holds).
    """
    chat = context.chat
    scope = MemoryScope.of_tool_chat(chat)
    text = _checked(text, MAX_WORKING_MEMORY_CHARS, "working memory")
    if not scope.working_memory().update(text=text, updated_at=Now()):
        try:
            with transaction.atomic():  # a savepoint: the unique constraint may refuse it
                scope.working_memory().model.objects.create(
                    subject=scope.subject, agent=scope.agent, owner_id=scope.owner_id, text=text
                )
        except IntegrityError:  # another call created it meanwhile: this text is the newer
            scope.working_memory().update(text=text, updated_at=Now())
    return "Working memory updated."


#: the four tools, for ``with_tools(*MEMORY_TOOLS)``.
MEMORY_TOOLS = (remember, recall, forget, update_working_memory)

for _tool in MEMORY_TOOLS:
    # Chats keep a tool's import path: the public one, so a change of this private module
    # never breaks a stored chat (agentloop.memory re-exports them).
    _tool.__module__ = "agentloop.memory"
