"""Spend a subject's budget from this process, call after call, until it refuses:
``budget_racer.py <chat pk> <go file>``.

Two of these race for the last cent of one owner's budget (tests/test_budgets_race.py), each
with a chat of its own, as two workers would. Each call reserves an estimate of $0.01 (the
reservation a model call makes before it is sent), then writes its usage row of exactly
$0.01 (which settles the reservation in the same transaction), until a reservation raises
``BudgetExceededError``. Prints ``SUMMARY {"spent": calls made, "refused": reason}``.
"""

from __future__ import annotations

import json
import sys
import time
from decimal import Decimal
from pathlib import Path

import django


def main(chat_pk: int, go: Path) -> None:
    django.setup()
    from agentloop.engine import UsageRecord
    from agentloop.engine.rate_limiting import CallEstimate
    from agentloop.exceptions import BudgetExceededError
    from agentloop.messages import TokenUsage
    from agentloop.models import Chat

    store = Chat.objects.get(pk=chat_pk).conversation.store
    estimate = CallEstimate("priced", "test", 5, 5, Decimal("0.01"))
    while not go.exists():
        time.sleep(0.002)
    spent, refused = 0, ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            reservation = store.budgets.reserve(estimate)
        except BudgetExceededError as exc:
            refused = exc.reason
            break
        usage = TokenUsage(input_tokens=5, output_tokens=5)
        store.transcript.record_usage(
            UsageRecord(
                "priced", "test", "succeeded", usage, Decimal("0.01"), reservation=reservation
            )  # fmt: skip
        )
        spent += 1
    print("SUMMARY " + json.dumps({"spent": spent, "refused": refused}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
