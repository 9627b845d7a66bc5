"""Run one background step of each chat at once, a thread each, as a threads-pool worker
would: ``concurrent_steps.py <pk>...``.

Prints ``PID <pid>`` first, ``STARTED <pk>`` as each step starts, then a last line
``SUMMARY {json}``: each chat's job action.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import django


def main(pks: list[int]) -> None:
    django.setup()
    from django.db import connections

    from agentloop.runners import run_step

    print(f"PID {os.getpid()}", flush=True)
    actions: dict[str, str] = {}

    def step(pk: int) -> None:
        print(f"STARTED {pk}", flush=True)
        try:
            actions[str(pk)] = run_step(pk).action
        finally:
            connections.close_all()

    threads = [threading.Thread(target=step, args=(pk,)) for pk in pks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("SUMMARY " + json.dumps({"actions": actions}), flush=True)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]])
