"""The ``Memory`` model: its vector column (pgvector on PostgreSQL, JSON elsewhere), the nearest
memories of one subject by cosine distance (HNSW on PostgreSQL, exact elsewhere), expiry and
erasure with the owner."""

from __future__ import annotations

import math
import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

import agentloop
from agentloop.budgets import Subject
from agentloop.models import Chat, Memory
from agentloop.models.memories import HNSW_DIMENSIONS

pytestmark = pytest.mark.django_db

OFFLINE = "offline:hash-embedding"


def remember(owner: Any, text: str, **fields: Any) -> Memory:
    vector = agentloop.embed(text, model=OFFLINE, record=False).vector
    return Memory.objects.create(
        owner=owner,
        subject=Subject.of(owner).key,
        text=text,
        embedding=vector,
        embedding_model=OFFLINE,
        **fields,
    )


def test_an_embedding_is_stored_and_read_back_as_floats(user: Any) -> None:
    memory = remember(user, "Ada's stack is Django and PostgreSQL")
    again = Memory.objects.get(pk=memory.pk)
    assert again.embedding == pytest.approx(memory.embedding)
    assert again.dimensions == 256 and again.subject == f"auth.user:{user.pk}"
    assert all(isinstance(value, float) for value in again.embedding)


def test_a_vector_with_a_non_number_is_refused(user: Any) -> None:
    with pytest.raises(ValueError, match="finite numbers"), transaction.atomic():
        Memory.objects.create(owner=user, subject="s", text="t", embedding=[0.1, math.nan])
    assert not Memory.objects.exists()


def test_nearest_finds_the_subjects_closest_memories_first(
    user: Any, django_user_model: Any
) -> None:
    other = django_user_model.objects.create_user("grace")
    remember(user, "The owner prefers the Vim editor")
    remember(user, "The owner's favourite food is ramen")
    remember(user, "The owner deploys on Fridays")
    remember(other, "The owner prefers the Vim editor and Emacs keys")  # someone else's
    query = agentloop.embed("Which editor does the owner prefer?", model=OFFLINE, record=False)

    found = Memory.objects.for_subject(user).nearest(query.vector, k=2)

    assert [m.text for m in found] == [
        "The owner prefers the Vim editor",
        found[1].text,
    ]
    assert all(m.owner_id == user.pk for m in found) and len(found) == 2
    assert found[0].distance < found[1].distance
    cosine = sum(a * b for a, b in zip(found[0].embedding, query.vector, strict=True))
    assert found[0].distance == pytest.approx(1 - cosine, abs=1e-5)


def test_nearest_compares_only_vectors_of_the_same_length(user: Any) -> None:
    remember(user, "kept at 256 dimensions")
    short = agentloop.embed("kept at 256 dimensions", model=OFFLINE, dimensions=64, record=False)
    assert Memory.objects.nearest(short.vector) == []


def test_expired_memories_are_not_live(user: Any) -> None:
    remember(user, "old news", expires_at=timezone.now() - timedelta(seconds=1))
    remember(user, "still true", expires_at=timezone.now() + timedelta(days=1))
    remember(user, "forever")
    assert sorted(Memory.objects.live().values_list("text", flat=True)) == [
        "forever",
        "still true",
    ]


def test_erasing_the_owner_erases_their_memories_and_a_chat_leaves_them(user: Any) -> None:
    chat = Chat.objects.create(model="offline:any", owner=user)
    memory = remember(user, "from a chat", chat=chat)
    chat.delete()
    memory.refresh_from_db()
    assert memory.chat is None
    user.delete()
    assert not Memory.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pgvector's HNSW is PostgreSQL's")
def test_on_postgresql_the_hnsw_index_serves_the_nearest_query(user: Any) -> None:
    rng = random.Random(7)  # noqa: S311 - test data
    for index in range(50):
        vector = [rng.gauss(0, 1) for _ in range(HNSW_DIMENSIONS)]
        Memory.objects.create(owner=user, subject="s", text=f"m{index}", embedding=vector)
    query = [rng.gauss(0, 1) for _ in range(HNSW_DIMENSIONS)]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'agentloop_memory_hnsw_1536'"
        )
        (definition,) = cursor.fetchone()
        assert "USING hnsw" in definition and "halfvec_cosine_ops" in definition
        cursor.execute("SET LOCAL enable_seqscan = off")  # few rows: make the planner show it can
    rows = Memory.objects.filter(subject="s")
    plan = _explain(rows, query)
    assert "agentloop_memory_hnsw_1536" in plan
    found = rows.nearest(query, k=5)
    exact = sorted(
        Memory.objects.filter(subject="s"),
        key=lambda m: 1 - _cos(m.embedding, query),
    )[:5]
    assert [m.pk for m in found] == [m.pk for m in exact]


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _explain(rows: Any, query: list[float]) -> str:
    from django.db.models.functions import Cast  # noqa: PLC0415 - PostgreSQL-only test
    from pgvector.django import CosineDistance, HalfVectorField  # noqa: PLC0415

    column = Cast("embedding", HalfVectorField(dimensions=len(query)))
    ordered = (
        rows.filter(dimensions=len(query))
        .annotate(distance=CosineDistance(column, query))
        .order_by("distance")[:5]
    )
    return ordered.explain()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pgvector's HNSW is PostgreSQL's")
def test_on_postgresql_nearest_keeps_ef_search_candidates_for_its_own_transaction(
    user: Any, settings: Any
) -> None:
    vector = [1.0] * HNSW_DIMENSIONS
    Memory.objects.create(owner=user, subject="s", text="one", embedding=vector)

    def ef_search_after(**options: Any) -> str:
        with transaction.atomic():
            assert [m.text for m in Memory.objects.nearest(vector, k=1, **options)] == ["one"]
            with connection.cursor() as cursor:
                cursor.execute("SHOW hnsw.ef_search")
                return cursor.fetchone()[0]

    assert ef_search_after() == "200"  # AGENTLOOP["MEMORY_EF_SEARCH"]'s default
    assert ef_search_after(ef_search=64) == "64"
    settings.AGENTLOOP = {"MEMORY_EF_SEARCH": 120}
    assert ef_search_after() == "120"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pgvector's HNSW is PostgreSQL's")
def test_on_postgresql_a_subject_with_few_memories_among_many_still_finds_them(user: Any) -> None:
    rng = random.Random(11)  # noqa: S311 - test data
    rows = [
        Memory(subject="crowd", text=f"c{index}",
               embedding=[rng.gauss(0, 1) for _ in range(HNSW_DIMENSIONS)])
        for index in range(300)
    ]  # fmt: skip
    rows += [
        Memory(subject="few", text=f"f{index}",
               embedding=[rng.gauss(0, 1) for _ in range(HNSW_DIMENSIONS)])
        for index in range(3)
    ]  # fmt: skip
    for row in rows:
        row.dimensions = HNSW_DIMENSIONS
    Memory.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the index scan, as at scale
    query = [rng.gauss(0, 1) for _ in range(HNSW_DIMENSIONS)]
    found = Memory.objects.filter(subject="few").nearest(query, k=3)
    assert sorted(m.text for m in found) == ["f0", "f1", "f2"]
