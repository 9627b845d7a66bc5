"""What parsing a streamed structured answer as it grows costs (docs/structured-output.md).

    python bench/partial_output.py [--size 20000] [--delta 4] [--repeat 5]

Feeds a JSON answer of about ``--size`` characters, in deltas of ``--delta`` characters, to
the engine's ``OutputParser`` (pydantic-core's partial parse, pydantic's partial validation
against a model), twice: as the engine does it (the text parsed again once it grew by a
``REPARSE_FRACTION``-th, every delta under ``ALWAYS_PARSED`` characters, and once at the end)
and parsing the whole text at every delta. Prints the best of ``--repeat`` wall times of
each, the partials each sent, and the characters each parsed in all. No Django, no database.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from pydantic import BaseModel

from agentloop.engine import _effects


class Hobby(BaseModel):
    name: str
    notes: str
    years: int


class Person(BaseModel):
    name: str
    age: int
    hobbies: list[Hobby]


def answer(size: int) -> str:
    """A Person's JSON of about ``size`` characters."""
    hobbies: list[dict[str, Any]] = []
    text = ""
    while len(text) < size:
        number = len(hobbies)
        hobbies.append({"name": f"hobby {number}", "notes": "practised with care " * 3,
                        "years": number % 40})  # fmt: skip
        text = json.dumps({"name": "John", "age": 30, "hobbies": hobbies})
    return text


def run(text: str, delta: int, every_delta: bool) -> tuple[float, int, int]:
    """Seconds, partials sent, characters parsed: one pass over ``text``."""
    fraction, always = _effects.REPARSE_FRACTION, _effects.ALWAYS_PARSED
    parsed: list[int] = []
    real = _effects.from_json

    def counting(data: str, **options: Any) -> Any:
        parsed.append(len(data))
        return real(data, **options)

    if every_delta:
        _effects.REPARSE_FRACTION = _effects.ALWAYS_PARSED = len(text) + 1
    _effects.from_json = counting  # type: ignore[assignment]
    try:
        parser = _effects.OutputParser(Person)
        sent = 0
        started = time.perf_counter()
        for start in range(0, len(text), delta):
            sent += parser.feed(text[start : start + delta]) is not None
        sent += parser.flush(ended=True) is not None
        seconds = time.perf_counter() - started
    finally:
        _effects.REPARSE_FRACTION, _effects.ALWAYS_PARSED = fraction, always
        _effects.from_json = real
    assert parser.last == json.loads(text)  # noqa: S101 - the end is always parsed
    return seconds, sent, sum(parsed)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--size", type=int, default=20_000)
    options.add_argument("--delta", type=int, default=4)
    options.add_argument("--repeat", type=int, default=5)
    args = options.parse_args(argv)
    text = answer(args.size)
    figures: dict[str, Any] = {"characters": len(text), "deltas": -(-len(text) // args.delta)}
    print(f"{len(text)} characters in {figures['deltas']} deltas of {args.delta}")
    for label, every_delta in (("as the engine parses", False), ("parsed at every delta", True)):
        runs = [run(text, args.delta, every_delta) for _ in range(args.repeat)]
        seconds = min(r[0] for r in runs)
        _, sent, read = runs[0]
        figures[label] = {"seconds": seconds, "partials": sent, "parsed": read}
        print(f"{label:>22}: {seconds * 1000:8.1f} ms, {sent:5} partials, {read:>11,} chars parsed")
    return figures


if __name__ == "__main__":
    main()
