"""Run chats to their end as a worker would, one ``run_step`` per job: ``pooled_jobs.py <pk>...``.

Meant to connect through a connection pooler (the test sets ``DATABASE_URL`` to it). The
model, registered here as "pooled", answers "echo: <the last user message>". Prints a last
line ``SUMMARY {json}``: every job's action per chat, and the warnings agentloop logged.
"""

from __future__ import annotations

import json
import logging
import sys

import django


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(pks: list[int]) -> None:
    django.setup()
    from agentloop import providers
    from agentloop.runners import run_step
    from agentloop.testing import FunctionProvider

    def echo(request):  # type: ignore[no-untyped-def]
        last = [m for m in request.messages if m.role == "user"][-1]
        return f"echo: {last.content}"

    providers.register("pooled", FunctionProvider(echo))
    kept = _Kept()
    logging.getLogger("agentloop").addHandler(kept)
    actions: dict[str, list[str]] = {}
    for pk in pks:
        jobs = actions.setdefault(str(pk), [])
        while len(jobs) < 10:
            outcome = run_step(pk)
            jobs.append(outcome.action)
            if not outcome.enqueue_next:
                break
    print("SUMMARY " + json.dumps({"actions": actions, "warnings": kept.messages}), flush=True)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]])
