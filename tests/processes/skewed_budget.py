"""Reserve against a chat's budget, spend from it, or sweep expired reservations, from a
process whose clock is ``offset`` seconds off (time-machine): ``skewed_budget.py reserve
<chat pk> <offset> <dollars>``, ``skewed_budget.py spend <chat pk> <offset> <dollars>`` (a
reservation, then its usage row of exactly that cost) or ``skewed_budget.py sweep 0
<offset>``.

The budget tests' clock checks (tests/test_budget_clock.py): a worker 20 minutes behind made
reservations that had expired by every other process's clock the moment they were made, a
sweeper ahead gave back reservations still held, and a worker behind just after midnight
charged yesterday (starting the day's counters again). Budgets come from
``AGENTLOOP_TEST_SETTINGS``. Prints ``SUMMARY {"reserved": rows, "released": count}``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import django
import time_machine


def main(action: str, chat_pk: int, offset: float, dollars: str) -> None:
    django.setup()
    from agentloop.budgets import release_expired
    from agentloop.engine import UsageRecord
    from agentloop.engine.rate_limiting import CallEstimate
    from agentloop.messages import TokenUsage
    from agentloop.models import Chat

    summary: dict[str, object] = {"reserved": 0, "released": 0}
    # This process's clock only: time-machine moves Python's view of the time, not the
    # database server's (nor SQLite's, read by the library in C).
    with time_machine.travel(datetime.now(UTC) + timedelta(seconds=offset), tick=True):
        if action in ("reserve", "spend"):
            store = Chat.objects.get(pk=chat_pk).conversation.store
            estimate = CallEstimate("priced", "test", 5, 5, Decimal(dollars))
            reservation = store.budgets.reserve(estimate)
            summary["reserved"] = len(reservation.rows)
            if action == "spend":
                usage = TokenUsage(input_tokens=5, output_tokens=5)
                store.transcript.record_usage(
                    UsageRecord(
                        "priced",
                        "test",
                        "succeeded",
                        usage,
                        Decimal(dollars),
                        reservation=reservation,
                    )  # fmt: skip
                )
        else:
            summary["released"] = release_expired()
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), (sys.argv[4:] or ["0"])[0])
