"""A chat's transcript read again without the rows this process already has.

Every step reads the whole transcript (``transcript_rows``): at hundreds of messages that
read, and building its messages, is most of a step's client work. On PostgreSQL the process
keeps the messages it last read of each chat (``KEPT_MESSAGES`` in all), and its next read
of the chat is one statement that

* checks, on the server, that the rows it keeps up to a key ``K`` are still exactly the
  chat's rows up to ``K``: the same number of joined rows, and the same sum of a hash of
  each row's key and tuple versions (``xmin`` and ``ctid`` of the message, of the call it
  answers and of its own call), so any write to those rows, by any code, any process, raw SQL
  included (an edit, a rewind, a compaction, a redaction, a deletion, a late commit of a
  row with a smaller key), makes it differ;
* returns the rows after ``K`` when they match, and every row when they don't.

``K`` is the key before the latest assistant message: its calls change as its tools run,
and what follows it is new. A tuple version can't come back once superseded: an update
writes a new version under a new transaction id (or, in the same transaction, at a new
``ctid``, while the old version still holds its own), and keys are never reused. So the
rows kept are only ever used while they are the rows the database has.

The kept messages are kept as values and never handed out: a read hands out messages made
of copies of them, so what a caller does to its messages can't reach the next read. A verb's
read (``shared``, under the chat's lease) hands out again the messages the last verb's read
did where their values still equal those kept (one deep comparison, several times cheaper
than a copy); one something changed since is replaced by a new copy. A read outside a verb
(``shared`` False: ``Conversation.messages``) hands out messages of its own, as the plain
read does.

Elsewhere (SQLite, other backends, a message model whose key isn't an integer) the read is
the plain ``SELECT`` of ``transcript_rows.transcript_query``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from operator import attrgetter, ne
from typing import Any

from django.db import connections

from ..messages import Message
from .sql import PreparedSelect, bound_cursor
from .transcript_rows import (
    MESSAGE_COLUMNS,
    kept_values,
    messages_from_rows,
    messages_from_values,
    trusted,
)

__all__ = ["KEPT_MESSAGES", "TranscriptRead", "TranscriptReads", "forget_kept_messages"]

#: the messages kept across all chats (the least recently read chats are dropped past it).
KEPT_MESSAGES = 50_000
_COLUMNS = len(MESSAGE_COLUMNS)


@dataclass(frozen=True)
class _Kept:
    """A chat's messages as last read, as values (``kept_values``: never handed out, a read
    hands out messages made of copies), and for each, the number of joined rows up to and
    including it and the sum of their hashes.

    ``handed`` holds, for each message, the one the last verb's read handed out
    (``_NOT_HANDED`` when none may be handed out again: the read was not a verb's)."""

    values: tuple[dict[str, Any], ...]
    ends: tuple[int, ...]
    sums: tuple[int, ...]
    handed: tuple[Message, ...]


class _KeptMessages:
    """The messages each chat's last read left, for the process (any thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._chats: OrderedDict[Any, _Kept] = OrderedDict()
        self._count = 0

    def get(self, key: Any) -> _Kept | None:
        with self._lock:
            return self._chats.get(key)

    def put(self, key: Any, kept: _Kept) -> None:
        with self._lock:
            old = self._chats.pop(key, None)
            if old is not None:
                self._count -= len(old.values)
            if len(kept.values) > self.limit:
                return
            self._chats[key] = kept
            self._count += len(kept.values)
            while self._count > self.limit:
                _, dropped = self._chats.popitem(last=False)
                self._count -= len(dropped.values)

    def clear(self) -> None:
        with self._lock:
            self._chats.clear()
            self._count = 0


_KEPT = _KeptMessages(KEPT_MESSAGES)


class TranscriptRead:
    """One read of a chat's transcript: ``sql`` and ``params`` to run (alone, or in the
    claim's round trip), then ``messages()`` of what they returned."""

    def __init__(self, reads: TranscriptReads, chat_pk: Any, sql: str, params: list[Any]) -> None:
        self.reads = reads
        self.chat_pk = chat_pk
        self.sql = sql
        self.params = params

    def messages(self, fetched: list[Any], shared: bool = True) -> list[Message]:
        """The transcript, from the rows the statement returned. ``shared``: for a verb (the
        messages an earlier verb's read handed out may come back, where nothing changed
        them since); else every message is the caller's own."""
        return messages_from_rows(self.reads.select.convert(fetched))

    def run(self, shared: bool = True) -> list[Message]:
        """Run the statement on the chat's database: ``messages()`` of its rows."""
        with bound_cursor(self.reads.using) as cursor:
            cursor.execute(self.sql, self.params)
            fetched = cursor.fetchall()
        return self.messages(fetched, shared)


class _IncrementalRead(TranscriptRead):
    """A read that sends what it keeps of the chat and is answered with the rest."""

    def __init__(self, reads: TranscriptReads, chat_pk: Any, kept: _Kept | None) -> None:
        until = 0 if kept is None else _kept_until(kept.values)
        if kept is None or until == 0:
            params = [chat_pk, 0, 0, 0, "0"]
        else:
            last_key = kept.values[until - 1]["key"]
            params = [chat_pk, last_key, last_key, kept.ends[until - 1], str(kept.sums[until - 1])]
        super().__init__(reads, chat_pk, reads.incremental_sql, params)
        self._kept = kept
        self._until = until

    def messages(self, fetched: list[Any], shared: bool = True) -> list[Message]:
        # Every returned row ends with its hash, then the server's count and sum of the rows
        # kept (a row with no message at all when nothing comes after them).
        kept, until = self._kept, self._until
        if not fetched or (fetched[0][-2], fetched[0][-1]) != (self.params[3], self.params[4]):
            kept, until = None, 0  # changed: every row came back
        rows = [row for row in fetched if row[0] is not None]
        new = messages_from_rows(self.reads.select.convert([row[:_COLUMNS] for row in rows]))
        if kept is None:
            values: list[dict[str, Any]] = []
            ends, sums, handed = [], [], []
            count = total = 0
        else:
            values = list(kept.values[:until])
            ends, sums = list(kept.ends[:until]), list(kept.sums[:until])
            handed = list(kept.handed[:until])
            count, total = (ends[-1], sums[-1]) if until else (0, 0)
        if shared:
            given = _handed_again(values, handed)
        else:
            given = messages_from_values(values)
        index = -1
        last_key: Any = None
        for row in rows:
            if row[0] != last_key:
                if index >= 0:
                    ends.append(count)
                    sums.append(total)
                index, last_key = index + 1, row[0]
            count += 1
            total += row[_COLUMNS]
        if index >= 0:
            ends.append(count)
            sums.append(total)
        # The new messages are handed out; copies of their values are kept.
        values.extend(kept_values(new))
        handed.extend(new if shared else [_NOT_HANDED] * len(new))
        kept = _Kept(tuple(values), tuple(ends), tuple(sums), tuple(handed))
        _KEPT.put(self.reads.key(self.chat_pk), kept)
        given.extend(new)
        return given


def _handed_again(kept: list[dict[str, Any]], handed: list[Message]) -> list[Message]:
    """For a verb: the messages handed out before whose values still equal those ``kept``
    (``handed`` is updated with the new messages made for the others)."""
    # The values compared deeply (calls, JSON values, lists): any change made to a message
    # since shows. In one pass at C speed for the usual case, nothing changed (hundreds per
    # read).
    if _differ(map(_values, handed), kept):
        for index, values in enumerate(kept):
            if _differ((handed[index].__dict__,), (values,)):
                handed[index] = messages_from_values([values])[0]
    return list(handed)


def _differ(handed: Any, kept: Any) -> bool:
    """Some values ``handed`` differ from those ``kept`` (a value a caller put in a message
    that can't even be compared differs too)."""
    try:
        return any(map(ne, handed, kept))
    except Exception:  # whatever it raised, the message is not as kept
        return True


_values = attrgetter("__dict__")
#: in ``_Kept.handed``, for a message no read may hand out again: equal to no message.
_NOT_HANDED = trusted(Message, {})


def _kept_until(kept: tuple[dict[str, Any], ...]) -> int:
    """How many of the messages ``kept`` the next read checks rather than reads again: those
    before the latest assistant message (whose calls change as its tools run)."""
    for index in range(len(kept) - 1, -1, -1):
        if kept[index]["role"] == "assistant":
            return index
    return 0


class TranscriptReads:
    """The transcript reads of one message model on one database."""

    def __init__(self, message_model: Any, select: PreparedSelect) -> None:
        self.message_model = message_model
        self.select = select
        self.using = select.using
        self.table = message_model._meta.db_table
        connection = connections[self.using]
        self.incremental_sql: str = ""
        if connection.vendor == "postgresql" and _integer_keys(message_model):
            self.incremental_sql = _incremental_sql(message_model, connection)

    def key(self, chat_pk: Any) -> tuple[str, str, Any]:
        return (self.using, self.table, chat_pk)

    def read(self, chat_pk: Any) -> TranscriptRead:
        """The next read of chat ``chat_pk``'s transcript."""
        if not self.incremental_sql:
            return TranscriptRead(self, chat_pk, self.select.sql, [chat_pk])
        return _IncrementalRead(self, chat_pk, _KEPT.get(self.key(chat_pk)))


def forget_kept_messages() -> None:
    """Drop every chat's kept messages (they are checked before use: this only frees memory)."""
    _KEPT.clear()


def _integer_keys(message_model: Any) -> bool:
    internal = message_model._meta.pk.get_internal_type()
    return internal in {"AutoField", "BigAutoField", "SmallAutoField", "IntegerField",
                        "BigIntegerField", "SmallIntegerField"}  # fmt: skip


def _incremental_sql(message_model: Any, connection: Any) -> str:
    """The transcript's columns (``MESSAGE_COLUMNS``, in order) and each row's hash, for the
    rows after a key, or all of them when the rows up to it are not the ones kept.

    Parameters: the chat's key, the last key kept (twice), the count of rows kept and the
    sum of their hashes (as text)."""
    quote = connection.ops.quote_name
    meta = message_model._meta
    calls = meta.get_field("tool_calls").related_model._meta
    answered = meta.get_field("tool_call").related_model._meta
    tables = {"": ("m", meta), "tool_call": ("a", answered), "tool_calls": ("c", calls)}

    def column(alias: str, model_meta: Any, field: str) -> str:
        return f"{alias}.{quote(model_meta.get_field(field).column)}"

    columns = []
    for index, name in enumerate(MESSAGE_COLUMNS):
        relation, _, field = name.rpartition("__")
        alias, model_meta = tables[relation]
        columns.append(f"{column(alias, model_meta, field)} AS c{index}")
    calls_id = MESSAGE_COLUMNS.index("tool_calls__id")
    # One hash of the row's key and tuple versions: any write to any of its rows changes it.
    version = f"m.{quote(meta.pk.column)}::text || " + " || ".join(
        f"coalesce({alias}.xmin::text || {alias}.ctid::text, '-')" for alias in ("m", "a", "c")
    )
    # Only identifiers from the models' own metadata go into the text; values are parameters.
    return (
        "WITH t AS (SELECT "  # noqa: S608
        + ", ".join(columns)
        + f", hashtextextended({version}, 0) AS h"
        + f" FROM {quote(meta.db_table)} m"
        + f" LEFT OUTER JOIN {quote(answered.db_table)} a"
        + f" ON {column('m', meta, 'tool_call')} = a.{quote(answered.pk.column)}"
        + f" LEFT OUTER JOIN {quote(calls.db_table)} c"
        + f" ON {column('c', calls, 'message')} = m.{quote(meta.pk.column)}"
        + f" WHERE {column('m', meta, 'chat')} = %s"
        + f" AND {column('m', meta, 'superseded_at')} IS NULL),"
        + " kept AS (SELECT count(*) AS n, coalesce(sum(h), 0)::text AS s FROM t WHERE c0 <= %s)"
        + " SELECT t.*, kept.n, kept.s FROM kept LEFT OUTER JOIN t"
        + " ON (t.c0 > %s OR kept.n <> %s OR kept.s <> %s)"
        + f" ORDER BY t.c0, t.c{calls_id}"
    )
