"""Text and JSON that every database stores: NUL bytes and lone surrogates made visible.

PostgreSQL refuses a NUL byte in text and in ``jsonb``; no UTF-8 encoder (psycopg's,
sqlite3's) takes a lone surrogate; neither database's JSON takes ``NaN`` or ``Infinity``.
Models answer, tools return and people type all of these. The text of every column the
models of agentloop write is made storable here, by their fields (``django_store.fields``),
so a row is never lost to them and SQLite stores what PostgreSQL stores: each NUL and each
lone surrogate becomes U+FFFD (the replacement character, shown where the text is shown), a
surrogate pair the character it spells, a non-finite number in JSON ``null`` (as
JavaScript's ``JSON.stringify`` writes it). Anything else is kept as it is.

No Django here: the engine digests tool arguments as they are stored (``ToolCall``).
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["REPLACEMENT", "storable_json", "storable_text"]

#: what stands for a NUL byte or a lone surrogate once stored.
REPLACEMENT = "\ufffd"

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _joined(pair: re.Match[str]) -> str:
    text = pair.group()
    return chr(0x10000 + ((ord(text[0]) - 0xD800) << 10) + (ord(text[1]) - 0xDC00))


def storable_text(text: str) -> str:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD (a surrogate pair joined
    into its character); ``text`` itself when it has none, as nearly all text."""
    if text.isascii():
        return text.replace("\x00", REPLACEMENT) if "\x00" in text else text
    if _UNSTORABLE.search(text) is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, _PAIR.sub(_joined, text))


def storable_json(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with :func:`storable_text` applied to
    every string in it, keys included, and non-finite numbers as None; ``value`` itself
    (not a copy) when nothing in it needs a change. Other types are left to the encoder."""
    kind = type(value)
    if kind is str:
        return storable_text(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        changed = False
        items = []
        for key, item in value.items():
            new_key = storable_text(key) if type(key) is str else key
            new_item = storable_json(item)
            changed = changed or new_key is not key or new_item is not item
            items.append((new_key, new_item))
        return dict(items) if changed else value
    if kind is list or kind is tuple:
        new_items = [storable_json(item) for item in value]
        if any(new is not old for new, old in zip(new_items, value, strict=True)):
            return new_items
        return value
    return value
