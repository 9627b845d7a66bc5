"""Decide on a waiting tool call once a go file appears: ``decide.py <chat pk> <call pk>
<approve|deny|answer|cancel> <go file>``. Prints ``SUMMARY {"outcome": "ok" | "conflict"}``
("cancel": "ok" when ``chat.cancel()`` found something to cancel, else "nothing").

Two of these race on one call (tests/test_one_writer.py, tests/test_people_in_the_loop.py):
exactly one decision may win.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import django


def main(chat_pk: int, call_pk: int, verb: str, go: Path) -> None:
    django.setup()
    from agentloop.exceptions import DecisionConflictError
    from agentloop.models import Chat

    chat = Chat.objects.get(pk=chat_pk)
    while not go.exists():
        time.sleep(0.001)
    try:
        if verb == "cancel":
            print("SUMMARY " + json.dumps({"outcome": "ok" if chat.cancel() else "nothing"}))
            return
        if verb == "approve":
            chat.approve(call_pk)
        elif verb == "deny":
            chat.deny(call_pk, reason="racing")
        else:
            chat.answer(call_pk, f"answer from {verb}")
        outcome = "ok"
    except DecisionConflictError:
        outcome = "conflict"
    print("SUMMARY " + json.dumps({"outcome": outcome}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
