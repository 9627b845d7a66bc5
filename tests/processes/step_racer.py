"""Step one chat from this process until it has ``turns`` finished turns:
``step_racer.py <chat pk> <turns> <asker: 0|1> <go file>``.

Two of these race on one chat (tests/test_one_writer.py). Each loads the chat afresh and
calls ``step()`` over and over; a ``ChatBusyError`` (the other process holds the claim) is
counted and retried. The asker also starts the next turn once one is finished. Prints
``SUMMARY {"steps": n, "busy": n}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import django


def main(chat_pk: int, turns: int, asker: bool, go: Path) -> None:
    django.setup()
    from agentloop.exceptions import ChatBusyError
    from agentloop.models import Chat

    while not go.exists():
        time.sleep(0.005)
    steps = busy = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        chat = Chat.objects.get(pk=chat_pk)
        finished = chat.messages.filter(role="assistant", tool_calls__isnull=True).count()
        if finished >= turns:
            break
        try:
            if chat.step() is not None:
                steps += 1
            elif asker and chat.is_complete():
                # Counted again: the other process may have finished the turn since the count
                # above (a settled chat can't change until a message is added).
                finished = chat.messages.filter(role="assistant", tool_calls__isnull=True).count()
                if finished < turns:
                    chat.ask_later(f"tools:step_one,step_two|step_three turn{finished + 1}")
        except ChatBusyError:
            busy += 1
    print("SUMMARY " + json.dumps({"steps": steps, "busy": busy}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", Path(sys.argv[4]))
