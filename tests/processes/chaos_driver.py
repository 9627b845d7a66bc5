"""An in-process caller of the chaos test: ``chaos_driver.py <chat pk,chat pk,...>``.

Calls ``chat.complete()`` on each listed chat that isn't settled yet, over and over, until
all of them are (at most 3 minutes). Some of the chats are also run by Celery workers: a
``ChatBusyError`` (a worker or another caller holds the chat) is counted and the chat tried
again later; a chat found settled counts as "nothing to do". tests/test_chaos.py kills these
processes with SIGKILL at random and starts new ones. Prints ``SUMMARY {"completed": n,
"busy": n, "nothing": n, "errors": [...]}``.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback

import django

DEADLINE = 180.0  # seconds: a driver never outlives a hung test
PAUSE = 0.05  # seconds between two passes over chats that were all busy


def main(chat_pks: list[int]) -> None:
    django.setup()
    from agentloop.exceptions import ChatBusyError
    from agentloop.models import Chat

    tally = {"completed": 0, "busy": 0, "nothing": 0}
    errors: list[str] = []
    left = list(chat_pks)
    random.shuffle(left)  # drivers over the same chats start at different ones
    deadline = time.monotonic() + DEADLINE
    while left and time.monotonic() < deadline:
        for pk in list(left):
            chat = Chat.objects.get(pk=pk)
            if chat.is_complete():
                tally["nothing"] += 1
                left.remove(pk)
                continue
            try:
                chat.complete()
            except ChatBusyError:
                tally["busy"] += 1
                continue
            except Exception:
                errors.append(traceback.format_exc(limit=3))
                continue
            tally["completed"] += 1
            print(f"completed {pk}", flush=True)
        time.sleep(PAUSE)
    print("SUMMARY " + json.dumps({**tally, "errors": errors, "left": left}), flush=True)


if __name__ == "__main__":
    main([int(pk) for pk in sys.argv[1].split(",") if pk])
