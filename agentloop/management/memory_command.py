"""``manage.py agentloop memory list | search | reindex``: memories from the command line.

    manage.py agentloop memory list [--owner USER] [--subject KEY] [--limit N] [--expired]
    manage.py agentloop memory search QUERY --owner USER [--subject KEY] [--k N]
    manage.py agentloop memory reindex [--model M] [--dimensions D] [--owner USER] [--batch N]

``reindex`` embeds again, with ``--model``, every memory embedded by another model (or at
other dimensions), a batch of the embedding API's limit at a time, each batch written in one
transaction as soon as its vectors are in, printing its progress. What is done is written:
a run stopped (Ctrl-C, a provider error) is continued by running it again.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Q

from ..budgets.subjects import Subject
from ..conf import agentloop_settings
from ..embeddings import embed
from ..embeddings.calls import resolve
from ..exceptions import AgentloopError
from ..models import Memory
from .data import _owner

__all__ = ["add_memory_parser", "handle_memory", "printable"]

#: characters of a memory's text a line shows.
SHOWN = 100


def add_memory_parser(subcommands: Any) -> None:
    """Add ``memory`` (with ``list``, ``search``, ``reindex``) to the command's parser."""
    parser = subcommands.add_parser(
        "memory",
        help="Memories: list, search by meaning, reindex after an embedding model change.",
    )
    actions = parser.add_subparsers(dest="action", metavar="action", required=True)
    listing = actions.add_parser("list", help="The latest memories, newest first.")
    _owner_and_subject(listing, required=False)
    listing.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")
    listing.add_argument("--expired", action="store_true", help="Only those past their expires_at.")
    searching = actions.add_parser("search", help="An owner's memories nearest a query.")
    searching.add_argument("query", metavar="QUERY", help="What to look for (by meaning).")
    _owner_and_subject(searching, required=True)
    searching.add_argument("--k", type=int, default=10, help="How many (default 10).")
    reindex = actions.add_parser(
        "reindex",
        help="Embed again the memories of another embedding model (resumable).",
        description=(
            "Every memory not embedded by --model (at --dimensions, when given) is embedded "
            "again, a batch of the API's limit at a time, each batch saved at once: run it "
            "again after a stop and it goes on where it stopped."
        ),
    )
    reindex.add_argument(
        "--model",
        help="'provider:model' (default: AGENTLOOP['MEMORY_EMBEDDING_MODEL']).",
    )
    reindex.add_argument(
        "--dimensions", type=int, help="Shorter vectors, for a model that can make them."
    )
    reindex.add_argument("--owner", metavar="USER", help="Only this owner's memories.")
    reindex.add_argument(
        "--batch", type=int, help="Memories per request (default: the API's limit)."
    )


def _owner_and_subject(parser: Any, *, required: bool) -> None:
    who = parser.add_mutually_exclusive_group(required=required)
    who.add_argument(
        "--owner", metavar="USER", help="The owner: a user's primary key, or else their username."
    )
    who.add_argument("--subject", metavar="KEY", help="A budget subject's key: 'team:7'.")


def handle_memory(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run the ``memory`` action ``options`` name, writing to ``command``'s output."""
    actions = {"list": _list, "search": _search, "reindex": _reindex}
    try:
        actions[options["action"]](command, options)
    except AgentloopError as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}") from None


def printable(text: str, limit: int = SHOWN) -> str:
    """``text`` on one line, its control characters shown as escapes (a memory's text is
    untrusted: no terminal escape sequence of it reaches the terminal), cut at ``limit``."""
    shown = "".join(
        char if char == " " or unicodedata.category(char)[0] not in "CZ" else repr(char)[1:-1]
        for char in text[: limit + 1]
    )
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _memories(options: dict[str, Any]) -> Any:
    memories = Memory.objects.all()
    if options.get("owner"):
        user = _owner(options["owner"])
        memories = memories.filter(Q(owner=user) | Q(subject=Subject.of(user).key))
    elif options.get("subject"):
        memories = memories.filter(subject=options["subject"])
    return memories


def _line(memory: Memory, distance: float | None = None) -> str:
    near = "" if distance is None else f"{distance:.3f} "
    expiry = f" expires {memory.expires_at:%Y-%m-%d}" if memory.expires_at else ""
    return (
        f"  {near}#{memory.pk} {memory.subject} {memory.created_at:%Y-%m-%d %H:%M}"
        f" [{memory.embedding_model or 'no embedding'}]{expiry}: {printable(memory.text)}"
    )


def _list(command: BaseCommand, options: dict[str, Any]) -> None:
    if options["limit"] < 1:
        raise CommandError("--limit must be at least 1.")
    memories = _memories(options)
    if options["expired"]:
        memories = memories.exclude(pk__in=Memory.objects.live().values("pk"))
    total = memories.count()
    shown = list(memories.order_by("-created_at", "-pk")[: options["limit"]])
    command.stdout.write(f"{total} memories" + (f", the latest {len(shown)}:" if shown else "."))
    for memory in shown:
        command.stdout.write(_line(memory))


def _search(command: BaseCommand, options: dict[str, Any]) -> None:
    if options["k"] < 1:
        raise CommandError("--k must be at least 1.")
    memories = _memories(options).live()
    embedding = memories.usual_embedding()
    if embedding is None:
        command.stdout.write("No memory with an embedding to search.")
        return
    model, dimensions = embedding
    nearest = memories.nearest_text(options["query"], embedding, k=options["k"], record=False)
    command.stdout.write(
        f"{len(nearest)} nearest by meaning ({model}, {dimensions} dimensions; distance 0 is "
        "the same direction):"
    )
    for memory in nearest:
        command.stdout.write(_line(memory, memory.distance))


def _reindex(command: BaseCommand, options: dict[str, Any]) -> None:
    model = options["model"] or agentloop_settings.MEMORY_EMBEDDING_MODEL
    dimensions = options["dimensions"]
    if dimensions is not None and dimensions < 1:
        raise CommandError("--dimensions must be at least 1.")
    limit = resolve(model)[3].max_batch  # an unknown provider or model fails here, first
    batch = options["batch"] or limit
    if not 1 <= batch <= limit:
        raise CommandError(f"--batch must be from 1 to {limit} ({model}'s limit per request).")
    stale_rows = ~Q(embedding_model=model) | Q(embedding__isnull=True)
    if dimensions is not None:
        stale_rows |= ~Q(dimensions=dimensions)
    # A memory with no text has nothing to embed: left as it is.
    stale = _memories(options).filter(stale_rows).exclude(text__regex=r"^\s*$")
    total = stale.count()
    if not total:
        command.stdout.write(f"Every memory is embedded by {model}: nothing to do.")
        return
    command.stdout.write(f"Embedding {total} memories again with {model}, {batch} per request.")
    done = after = 0
    while True:
        rows = list(stale.filter(pk__gt=after).order_by("pk").values_list("pk", "text")[:batch])
        if not rows:
            break
        after = rows[-1][0]
        try:
            vectors = embed([text for _, text in rows], model=model, dimensions=dimensions)
        except AgentloopError as exc:
            raise CommandError(
                f"Stopped after {done} of {total}: {type(exc).__name__}: {exc} Run the same "
                "command again to go on from there."
            ) from None
        with transaction.atomic():
            for (pk, text), vector in zip(rows, vectors, strict=True):
                # The text is checked again: a memory edited meanwhile keeps its newer vector.
                Memory.objects.filter(pk=pk, text=text).update(
                    embedding=vector, embedding_model=model, dimensions=len(vector)
                )
        done += len(rows)
        command.stdout.write(f"  {done}/{total} ({done * 100 // total}%)")
    command.stdout.write(command.style.SUCCESS(f"Reindexed {done} memories with {model}."))
