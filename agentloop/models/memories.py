"""Memory: what an owner's chats keep across conversations, searchable by meaning.

A row belongs to a budget subject (``"auth.user:42"``, the owner by default; a team or a
tenant when ``BUDGET_SUBJECT`` says so), optionally to an agent, and may come from a chat
and a message. Its embedding is a pgvector ``vector`` column on PostgreSQL, searched by
cosine distance through an HNSW index (migration 0021 builds one for 1,536 dimensions:
``text-embedding-3-small``); on other databases a JSON list of numbers, searched exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections, models
from django.db.models import Count, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Now
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..budgets.subjects import Subject
from ..conf import agentloop_settings
from ..django_store.fields import (
    StorableCharField,
    StorableJSONField,
    StorableTextField,
    optional_link,
)
from ..embeddings import embed
from .chat import Chat
from .message import Message

__all__ = [
    "HNSW_DIMENSIONS",
    "AbstractMemory",
    "EmbeddingField",
    "Memory",
    "MemoryQuerySet",
    "WorkingMemory",
]

#: the dimensions migration 0021's HNSW index serves (a partial index on rows of that many).
HNSW_DIMENSIONS = 1536


class EmbeddingField(models.Field):
    """A vector of floats: pgvector's ``vector`` column on PostgreSQL (any dimensions: each
    row's count is in its ``dimensions`` column, and an HNSW index serves one count), a JSON
    list in a text column elsewhere. Both read and write the text ``[0.1,0.2,...]``."""

    description = _("Embedding vector")
    empty_strings_allowed = False

    def db_type(self, connection: Any) -> str:
        return "vector" if connection.vendor == "postgresql" else "text"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> list[float] | None:
        return self.to_python(value)

    def to_python(self, value: Any) -> list[float] | None:
        if value is None or isinstance(value, list):
            return value
        return [float(number) for number in json.loads(value)]

    def get_prep_value(self, value: Any) -> str | None:
        if value is None:
            return None
        numbers = [float(number) for number in value]
        if not numbers or not all(math.isfinite(number) for number in numbers):
            raise ValueError("An embedding is a non-empty list of finite numbers")
        return "[" + ",".join(repr(number) for number in numbers) + "]"


def _cosine_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """1 - cos(a, b), as pgvector's ``<=>`` computes it (2 for a zero vector's NaN)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return 1.0 - dot / norms if norms else 2.0


class MemoryQuerySet(models.QuerySet["AbstractMemory"]):
    def for_subject(self, subject: Any) -> MemoryQuerySet:
        """The memories of ``subject`` (a user or any model instance, a key, a Subject)."""
        return self.filter(subject=Subject.of(subject).key)

    def live(self) -> MemoryQuerySet:
        """Those not past their expiry (by the database's clock)."""
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))

    def nearest(
        self, vector: Sequence[float], k: int = 10, *, ef_search: int | None = None
    ) -> list[AbstractMemory]:
        """The ``k`` memories nearest ``vector`` by cosine distance (each with ``distance``
        set), nearest first, among those of this queryset embedded with as many dimensions.

        PostgreSQL orders by pgvector's ``<=>`` in the database (the HNSW index of
        :data:`HNSW_DIMENSIONS` serves it: an approximate search, keeping ``ef_search``
        candidates, by default ``AGENTLOOP["MEMORY_EF_SEARCH"]``); other databases compare
        every candidate here (an exact search: fine for one subject's memories)."""
        if k < 1:
            return []
        vector = [float(number) for number in vector]
        rows = self.filter(dimensions=len(vector), embedding__isnull=False)
        if connections[self.db].vendor == "postgresql":
            # The postgres extra: pgvector's field and operator, on PostgreSQL only.
            from pgvector.django import CosineDistance, HalfVectorField

            # The cast of the HNSW indexes (models/indexes.py), or the planner can't use them.
            column = Cast("embedding", HalfVectorField(dimensions=len(vector)))
            # HNSW scans go on until k rows pass the filter (pgvector 0.8's iterative scans,
            # in exact order), for this transaction only: without it an index scan returns
            # its ef_search nearest rows of any subject, and a subject with few memories
            # among many finds none of them. Set by the statement itself (one round trip):
            # an uncorrelated subquery in WHERE is an InitPlan the plan's gating Result
            # evaluates once, before the index scan returns its first row. ef_search is set
            # the same way: the planner costs the scan at the session's value (a high one
            # makes it choose a sequential scan on a smaller table), the scan keeps ours.
            keep = str(int(ef_search or agentloop_settings.MEMORY_EF_SEARCH))
            settings_sql = (
                "(SELECT set_config('hnsw.iterative_scan', 'strict_order', true) "
                "|| set_config('hnsw.ef_search', %s, true))"
            )
            ordered = rows.annotate(distance=CosineDistance(column, vector))
            # The value is a parameter; the SQL is this constant text.
            settings_set = RawSQL(settings_sql, (keep,))  # noqa: S611
            scanning = ordered.alias(_set=settings_set).filter(_set="strict_order" + keep)
            return list(scanning.order_by("distance")[:k])
        # One statement here too: every candidate, scored exactly.
        candidates: list[AbstractMemory] = list(rows)
        scored = (
            sorted(
                (_cosine_distance(memory.embedding or [], vector), memory.pk, memory)
                for memory in candidates
            )[:k]
            if candidates
            else []
        )
        nearest: list[AbstractMemory] = []
        for distance, _pk, memory in scored:
            memory.distance = distance
            nearest.append(memory)
        return nearest

    def usual_embedding(self) -> tuple[str, int] | None:
        """The embedding model and dimensions most of these memories were embedded with (a
        query is embedded so to be compared with them); None when none has an embedding."""
        common = (
            self.exclude(embedding_model="")
            .filter(dimensions__isnull=False)
            .order_by()
            .values("embedding_model", "dimensions")
            .annotate(count=Count("pk"))
            .order_by("-count")
            .first()
        )
        return None if common is None else (common["embedding_model"], common["dimensions"])

    def nearest_text(
        self, text: str, embedding: tuple[str, int], k: int = 10, **embed_options: Any
    ) -> list[AbstractMemory]:
        """The ``k`` memories embedded as ``embedding`` says (model, dimensions: see
        :meth:`usual_embedding`) nearest ``text`` by meaning (see :meth:`nearest`), ``text``
        embedded the same way. ``embed_options`` go to ``agentloop.embeddings.embed``."""
        model, dimensions = embedding
        vector = embed(text, model=model, **embed_options).vector
        if len(vector) != dimensions:  # the memories were embedded shorter (or longer)
            vector = embed(text, model=model, dimensions=dimensions, **embed_options).vector
        return self.filter(embedding_model=model).nearest(vector, k=k)

    def by_ids(self, similarities: Sequence[tuple[Any, float]]) -> list[AbstractMemory]:
        """The memories of this queryset among ``similarities`` (``(pk, similarity)``), in
        that order, each with ``distance`` set back from its similarity (one statement); a
        memory deleted or expired meanwhile is left out."""
        found: dict[Any, Any] = self.in_bulk([pk for pk, _ in similarities])
        kept: list[AbstractMemory] = []
        for pk, similarity in similarities:
            memory = found.get(pk)
            if memory is not None:
                memory.distance = 1.0 - similarity
                kept.append(memory)
        return kept


class AbstractMemory(models.Model):
    """One thing remembered: its text and metadata, its embedding, whose it is and where it
    came from."""

    #: the budget subject it belongs to (``Subject.key``: "auth.user:42").
    subject = StorableCharField(_("subject"), max_length=255)
    #: the agent it belongs to (its import path), or "" for every agent of the subject.
    agent = StorableCharField(_("agent"), max_length=255, blank=True, default="")
    text = StorableTextField(_("text"))
    metadata = StorableJSONField(_("metadata"), default=dict, blank=True)
    embedding = EmbeddingField(_("embedding"), null=True, blank=True)
    #: "provider:model" that made ``embedding``, and its length (a search compares like with like).
    embedding_model = StorableCharField(_("embedding model"), max_length=200, blank=True)
    dimensions = models.PositiveIntegerField(_("dimensions"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    objects = MemoryQuerySet.as_manager()

    #: set on the rows :meth:`MemoryQuerySet.nearest` returns: their cosine distance.
    distance: float | None = None

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.text[:60]

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The length is read off the vector, so a search never compares unlike vectors.
        self.dimensions = len(self.embedding) if self.embedding is not None else None
        fields = kwargs.get("update_fields")
        if fields is not None and "embedding" in fields:
            kwargs["update_fields"] = {*fields, "dimensions"}
        super().save(*args, **kwargs)


class Memory(AbstractMemory):
    #: erasing an owner erases what was remembered of them; (owner, created_at) below
    #: serves the owner's lookups.
    owner = optional_link(
        settings.AUTH_USER_MODEL,
        _("owner"),
        "agentloop_memories",
        models.CASCADE,
        db_index=False,
    )
    chat = optional_link(Chat, _("chat"), "memories")
    message = optional_link(Message, _("message"), "memories")

    class Meta(AbstractMemory.Meta):
        verbose_name = _("memory")
        verbose_name_plural = _("memories")
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["subject", "agent", "created_at"], name="agentloop_memory_subj_idx"
            ),
            models.Index(fields=["owner", "created_at"], name="agentloop_memory_owner_idx"),
        ]


class WorkingMemory(models.Model):
    """A subject's working memory: one document (a profile, the state of a task) the model
    keeps up to date with the ``update_working_memory`` tool, given with the instructions of
    every model call of a chat ``with_memory(working=True)``."""

    #: the budget subject it belongs to (``Subject.key``), and optionally one agent.
    subject = StorableCharField(_("subject"), max_length=255)
    agent = StorableCharField(_("agent"), max_length=255, blank=True, default="")
    #: erasing an owner erases it.
    owner = optional_link(
        settings.AUTH_USER_MODEL, _("owner"), "agentloop_working_memories", models.CASCADE
    )
    #: the document (model text: untrusted, escape it wherever it is shown).
    text = StorableTextField(_("text"), blank=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("working memory")
        verbose_name_plural = _("working memories")
        constraints = [
            models.UniqueConstraint(
                fields=["subject", "agent"], name="agentloop_working_memory_subject"
            )
        ]

    def __str__(self) -> str:
        return self.text[:60]
