"""Memories for operators (docs/memory.md, issue 42 item 7): the admin's list searched by text
and by meaning, retention deleting expired memories, and ``manage.py agentloop memory``
(list, search, reindex: batched, with progress, resumable)."""

from __future__ import annotations

import io
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

import agentloop
from agentloop import data
from agentloop.budgets import Subject
from agentloop.models import Memory, Usage
from tests.embedding_providers import FlakyEmbeddings

pytestmark = pytest.mark.django_db

MODEL = "offline:hash-embedding"


def remember(owner: Any, text: str, *, model: str = MODEL, dimensions: int | None = None,
             subject: str | None = None, **fields: Any) -> Memory:  # fmt: skip
    vector = agentloop.embed(text, model=model, dimensions=dimensions, record=False).vector
    return Memory.objects.create(
        owner=owner,
        subject=subject or Subject.of(owner).key,
        text=text,
        embedding=vector,
        embedding_model=model,
        **fields,
    )


@pytest.fixture
def ada(django_user_model):
    return django_user_model.objects.create_user("ada")


@pytest.fixture
def grace(django_user_model):
    return django_user_model.objects.create_user("grace")


# -- the admin -----------------------------------------------------------------------------------
def listed(page: str) -> list[str]:
    """The memories' texts in a change list page, in order (escaped as the page has them)."""
    return re.findall(r'<th class="field-short_text"><a [^>]*>(.*?)</a>', page)


def test_the_admin_lists_memories_and_filters_them_by_subject_and_owner(admin_client, ada, grace):
    remember(ada, "Ada prefers the Vim editor")
    remember(grace, "Grace prefers the Emacs editor")
    remember(grace, "The team ships on Tuesdays", subject="team:7")
    url = reverse("admin:agentloop_memory_changelist")

    page = admin_client.get(url).content.decode()
    assert sorted(listed(page)) == sorted(
        ["Ada prefers the Vim editor", "Grace prefers the Emacs editor",
         "The team ships on Tuesdays"]
    )  # fmt: skip
    assert "team:7 (1)" in page  # the subject filter offers each subject with its count
    assert "By search by" in page and "meaning (nearest first)" in page

    by_subject = admin_client.get(url, {"subject": "team:7"}).content.decode()
    assert listed(by_subject) == ["The team ships on Tuesdays"]
    by_owner = admin_client.get(url, {"owner__id__exact": ada.pk}).content.decode()
    assert listed(by_owner) == ["Ada prefers the Vim editor"]


def test_the_admin_searches_the_text(admin_client, ada):
    remember(ada, "Ada prefers the Vim editor")
    remember(ada, "Ada deploys on Fridays")

    page = admin_client.get(reverse("admin:agentloop_memory_changelist"), {"q": "fridays"})

    assert listed(page.content.decode()) == ["Ada deploys on Fridays"]


def test_the_admin_searches_by_meaning_nearest_first_with_the_memories_model(
    admin_client, ada, grace, django_user_model
):
    remember(ada, "Ada deploys on Fridays")
    remember(ada, "Ada prefers the Vim editor")
    remember(grace, "Grace writes her editor macros in Lisp")
    remember(ada, "Ada's cat is called Vim too", model=MODEL, dimensions=64)  # another length
    url = reverse("admin:agentloop_memory_changelist")
    admin = django_user_model.objects.get(username="admin")

    page = admin_client.get(url, {"q": "the editor she likes most", "by": "meaning"})
    text = page.content.decode()

    found = listed(text)
    # No word of the query is "Vim" or "Lisp": ordered by meaning, not matched by text.
    assert found[0] == "Ada prefers the Vim editor"
    assert set(found) == {
        "Ada prefers the Vim editor", "Ada deploys on Fridays",
        "Grace writes her editor macros in Lisp",
    }  # fmt: skip
    distances = [float(d) for d in re.findall(r'<td class="field-distance_shown">([\d.]+)', text)]
    assert distances == sorted(distances) and len(distances) == 3
    assert "Nearest 3 by meaning (offline:hash-embedding, 256 dimensions)." in text
    assert "1 memories embedded by other models (or at other lengths) are not compared." in text
    # The query's embedding is a usage row of the staff member who searched.
    assert Usage.objects.filter(owner=admin, model="hash-embedding").count() == 1

    # The filters narrow the search by meaning too.
    only_grace = admin_client.get(
        url, {"q": "editor", "by": "meaning", "owner__id__exact": grace.pk}
    ).content.decode()
    assert listed(only_grace) == ["Grace writes her editor macros in Lisp"]


def test_the_admin_escapes_a_memorys_text(admin_client, ada):
    remember(ada, '<script>alert("remembered")</script> and <b>bold</b>')

    for query in ({}, {"q": "alert"}, {"q": "alert", "by": "meaning"}):
        page = admin_client.get(reverse("admin:agentloop_memory_changelist"), query)
        text = page.content.decode()
        assert "<script>alert(" not in text and "<b>bold</b>" not in text
        assert "&lt;script&gt;alert(&quot;remembered&quot;)&lt;/script&gt;" in text


def test_a_search_by_meaning_that_cant_embed_says_why_and_lists_nothing(admin_client, ada):
    Memory.objects.create(owner=ada, subject=Subject.of(ada).key, text="no vector",
                          embedding_model="nobody:model", embedding=[1.0, 0.0])  # fmt: skip

    page = admin_client.get(
        reverse("admin:agentloop_memory_changelist"), {"q": "vector", "by": "meaning"}
    ).content.decode()

    assert listed(page) == []
    assert "Can&#x27;t embed the query with nobody:model" in page


def test_people_without_the_admin_permission_dont_see_memories(client, ada):
    remember(ada, "Ada prefers the Vim editor")
    client.force_login(ada)

    page = client.get(reverse("admin:agentloop_memory_changelist"))

    assert page.status_code == 302 and "Vim" not in page.content.decode()


# -- retention -----------------------------------------------------------------------------------
def test_retention_deletes_expired_memories_with_or_without_a_period(ada, settings):
    past = timezone.now() - timedelta(minutes=1)
    expired = remember(ada, "The door code is 1234 this week", expires_at=past)
    later = remember(ada, "The door code next week", expires_at=timezone.now() + timedelta(days=7))
    kept = remember(ada, "Ada prefers the Vim editor")

    assert list(data.expired_memories()) == [expired]
    report = data.delete_idle_chats()  # RETENTION_DAYS is None: no chat goes, expiries do

    assert report.memories_expired == 1
    assert "Deleted 1 expired memories." in str(report)
    assert set(Memory.objects.all()) == {later, kept}

    Memory.objects.filter(pk=later.pk).update(expires_at=past)
    assert data.delete_idle_chats(90).memories_expired == 1
    assert list(Memory.objects.all()) == [kept]


def test_expired_memories_go_a_batch_at_a_time(ada, django_assert_max_num_queries):
    past = timezone.now() - timedelta(days=1)
    Memory.objects.bulk_create(
        Memory(owner=ada, subject="auth.user:1", text=f"m{n}", expires_at=past) for n in range(450)
    )
    with django_assert_max_num_queries(3 * 3 + 1):  # per batch of 200: look, and delete
        assert data.delete_expired_memories() == 450
    assert not Memory.objects.exists()


def test_the_retention_command_counts_expired_memories_and_deletes_them(ada):
    remember(ada, "gone soon", expires_at=timezone.now() - timedelta(seconds=1))
    out = io.StringIO()

    call_command("agentloop", "retention", "--days", "30", "--dry-run", stdout=out)
    assert "1 memories are past their expiry (none deleted)" in out.getvalue()
    assert Memory.objects.count() == 1

    call_command("agentloop", "retention", stdout=out)
    assert "Deleted 1 expired memories." in out.getvalue()
    assert not Memory.objects.exists()


# -- the command ---------------------------------------------------------------------------------
def run(*args: str) -> str:
    out = io.StringIO()
    call_command("agentloop", "memory", *args, stdout=out)
    return out.getvalue()


def test_list_shows_the_latest_memories_on_one_line_each_without_control_characters(ada, grace):
    remember(ada, "Ada prefers the Vim editor")
    remember(grace, "Grace says \x1b[31mred\x1b[0m\nand a second line")

    everything = run("list")
    assert everything.splitlines()[0] == "2 memories, the latest 2:"
    assert "\x1b" not in everything and "\\x1b[31mred" in everything
    assert "and a second line" in everything.splitlines()[1] + everything.splitlines()[2]

    adas = run("list", "--owner", "ada")
    assert adas.splitlines()[0] == "1 memories, the latest 1:"
    assert "Ada prefers the Vim editor" in adas and "Grace" not in adas


def test_list_expired_shows_only_those_past_their_expiry(ada):
    remember(ada, "old news", expires_at=timezone.now() - timedelta(days=1))
    remember(ada, "still true")

    shown = run("list", "--expired")

    assert "old news" in shown and "still true" not in shown


def test_search_finds_the_owners_memories_nearest_the_query_and_no_one_elses(ada, grace):
    remember(ada, "Ada prefers the Vim editor")
    remember(ada, "Ada deploys on Fridays")
    remember(grace, "Grace prefers the Vim editor as well")

    shown = run("search", "which editor", "--owner", str(ada.pk), "--k", "1")

    assert shown.splitlines()[0].startswith("1 nearest by meaning (offline:hash-embedding")
    assert "Ada prefers the Vim editor" in shown
    assert "Grace" not in shown and "Fridays" not in shown
    assert not Usage.objects.exists()  # an operator's look costs no one's budget


def test_search_needs_an_owner_and_names_an_unknown_one():
    with pytest.raises(CommandError, match="one of the arguments --owner --subject is required"):
        run("search", "editor")
    with pytest.raises(CommandError, match="No user with the primary key or username 'nobody'"):
        run("search", "editor", "--owner", "nobody")


def test_reindex_embeds_again_in_batches_with_progress_and_resumes_after_a_stop(ada):
    memories = [remember(ada, f"fact number {n} about Ada") for n in range(8)]
    remember(ada, "already done", model=MODEL, dimensions=32)
    flaky = FlakyEmbeddings(allowed=2)
    agentloop.providers.register("flaky", flaky)
    try:
        with pytest.raises(CommandError) as stopped:
            run("reindex", "--model", "flaky:hash-embedding", "--dimensions", "32")
        # Two batches of the API's limit (3) written; the third refused.
        assert str(stopped.value).startswith("Stopped after 6 of 9: BadRequestError")
        assert "Run the same command again" in str(stopped.value)
        redone = Memory.objects.filter(embedding_model="flaky:hash-embedding")
        assert redone.count() == 6 and set(redone.values_list("dimensions", flat=True)) == {32}

        flaky.allowed = 10
        out = run("reindex", "--model", "flaky:hash-embedding", "--dimensions", "32")
    finally:
        agentloop.providers.unregister("flaky")

    assert out.splitlines() == [
        "Embedding 3 memories again with flaky:hash-embedding, 3 per request.",
        "  3/3 (100%)",
        "Reindexed 3 memories with flaky:hash-embedding.",
    ]
    assert flaky.requests == 4  # 2 + the refused one + 1: nothing embedded twice
    for memory in memories:
        memory.refresh_from_db()
        assert memory.embedding_model == "flaky:hash-embedding" and memory.dimensions == 32
        assert len(memory.embedding) == 32
    # Reindexed memories are found by the new model's vectors.
    question = agentloop.embed("fact number 5 about Ada", model=MODEL, dimensions=32).vector
    assert (
        Memory.objects.filter(embedding_model="flaky:hash-embedding").nearest(question, k=1)[0].text
        == "fact number 5 about Ada"
    )


def test_reindex_prints_progress_per_batch_and_nothing_to_do_after(ada):
    for n in range(5):
        remember(ada, f"fact {n}")

    out = run("reindex", "--model", MODEL, "--dimensions", "48", "--batch", "2")

    assert out.splitlines() == [
        "Embedding 5 memories again with offline:hash-embedding, 2 per request.",
        "  2/5 (40%)",
        "  4/5 (80%)",
        "  5/5 (100%)",
        "Reindexed 5 memories with offline:hash-embedding.",
    ]
    again = run("reindex", "--model", MODEL, "--dimensions", "48")
    assert again.strip() == "Every memory is embedded by offline:hash-embedding: nothing to do."


def test_reindex_refuses_bad_options_in_one_line(ada):
    remember(ada, "fact")
    with pytest.raises(CommandError, match=r"--batch must be from 1 to 2048"):
        run("reindex", "--model", MODEL, "--batch", "5000")
    with pytest.raises(CommandError, match=r"^UnknownProviderError: "):
        run("reindex", "--model", "nowhere:model")
    with pytest.raises(CommandError, match=r"--dimensions must be at least 1"):
        run("reindex", "--dimensions", "0")
    assert Memory.objects.get().embedding_model == MODEL  # nothing changed
