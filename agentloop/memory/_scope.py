"""Whose memories a chat reaches (``MemoryScope``): its budget subject, and its agent when
its memory is per agent. Every read and write of the memory tools and of the recall goes
through one, so the subject (and agent) is always a filter in the statement itself."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from django.apps import apps

from ..budgets.subjects import Subject, subject_hook
from ..conf import agentloop_settings
from ..exceptions import ConfigurationError

__all__ = ["MemoryScope", "as_data"]


def as_data(text: str) -> str:
    """``text`` made safe to put between the tags that mark it as data for the model (a
    memory can't close its tag and pass for instructions)."""
    return html.escape(text, quote=False)


@dataclass(frozen=True)
class MemoryScope:
    """The memories one chat may read and write: those of ``subject`` and ``agent`` ("":
    the subject's shared ones)."""

    subject: str
    agent: str = ""
    owner_id: Any = None
    #: the embedding model of the chat's memories ("provider:model"); "": the project's
    #: (``AGENTLOOP["MEMORY_EMBEDDING_MODEL"]``).
    model: str = ""

    def __post_init__(self) -> None:
        if not self.model:  # read when made, so a settings change reaches the next chat
            object.__setattr__(self, "model", agentloop_settings.MEMORY_EMBEDDING_MODEL)

    @classmethod
    def of_chat(cls, chat: Any) -> MemoryScope | None:
        """The scope of a persisted chat: its budget subject (``AGENTLOOP["BUDGET_SUBJECT"]``;
        the first when it names several; by default its owner), its agent when
        ``with_memory(per_agent=True)``; None when the chat has no subject (no owner). Reads
        nothing from the database for the default subject."""
        found = subject_hook()(chat)
        values = list(found) if isinstance(found, list | tuple) else [found]
        first = next((value for value in values if value is not None), None)
        if first is None:
            return None
        options = getattr(chat, "memory", None) or {}
        agent = (getattr(chat, "agent_path", "") or "") if options.get("per_agent") else ""
        return cls(
            subject=Subject.of(first).key,
            agent=agent,
            owner_id=getattr(chat, "owner_id", None),
            model=options.get("model") or "",
        )

    @classmethod
    def of_tool_chat(cls, chat: Any) -> MemoryScope:
        """The scope of the chat a memory tool runs for; a clear error where there is none."""
        if getattr(chat, "pk", None) is None or not hasattr(chat, "owner_id"):
            raise ConfigurationError(
                "The memory tools need a persisted chat (Chat.objects.create(...)): "
                "memories belong to its owner."
            )
        scope = cls.of_chat(chat)
        if scope is None:
            raise ConfigurationError(
                f"Chat {chat.pk} has no owner (no budget subject): it has no memories."
            )
        return scope

    def memories(self) -> Any:
        """This scope's memories (a ``MemoryQuerySet``), expired ones left out."""
        memory = apps.get_model("agentloop", "Memory")  # app loading: models import the store
        return memory.objects.filter(subject=self.subject, agent=self.agent).live()

    def nearest(self, vector: list[float], k: int) -> list[Any]:
        """This scope's ``k`` memories nearest ``vector``, among those its model embedded:
        vectors of another model (even of the same length) don't compare."""
        return self.memories().filter(embedding_model=self.model).nearest(vector, k=k)

    def working_memory(self) -> Any:
        """This scope's working memory row, if any (a queryset of at most one)."""
        working = apps.get_model("agentloop", "WorkingMemory")
        return working.objects.filter(subject=self.subject, agent=self.agent)
