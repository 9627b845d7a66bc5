"""Two worker "hosts", one cut from the database and the broker mid-step (issue 21).

Each host is a network namespace the test creates, joined to the root namespace by a veth
pair; a TCP forwarder on the root side of each pair carries its traffic to PostgreSQL and
the private Redis (both listen on 127.0.0.1 only). Host A runs a slow tool that is not safe
to repeat; the test takes A's link down mid-tool (a partition: packets dropped, no error on
either side). With a short lease, host B takes the chat over and completes it: the cut call
gets the "interrupted, effect unknown" result and is never run again. Then the link comes
back and A's tool finishes: A writes nothing (its lease is gone), and the rows B wrote stay
exactly as they were.

Needs root and iproute2 (``ip``): skipped without them, except under ``CI=true``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.db import connection

from agentloop.models import Chat
from tests.faults import invariants
from tests.faults.parts import (
    Forwarder,
    Host,
    free_port,
    network_namespaces_available,
    record_recovery,
    unavailable,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.timeout(300),
]

LEASE = 3  # seconds
SWEEP_EVERY = 1.0


@pytest.fixture
def hosts(faults) -> Iterator[dict[str, tuple[Host, str, str]]]:
    """Hosts "a" and "b": each with the DATABASE_URL and broker URL it reaches through the
    forwarder. Namespaces, links and the forwarder are removed at the end."""
    reason = network_namespaces_available()
    if reason:
        unavailable(reason)
    settings = connection.settings_dict
    made: list[Host] = []
    forwarder = None
    try:
        routes = []
        reach: dict[str, tuple[Host, str, str]] = {}
        for label in ("a", "b"):
            host = Host(label)
            made.append(host)
            host.create()
            pg_port, redis_port = free_port(), free_port()
            routes.append((host.root_address, pg_port, "127.0.0.1", int(settings["PORT"] or 5432)))
            routes.append((host.root_address, redis_port, "127.0.0.1", faults.redis.port))
            database_url = f"postgres://{settings['USER']}@{host.root_address}:{pg_port}/x"
            broker_url = faults.redis.url(0, host=host.root_address, port=redis_port)
            reach[label] = (host, database_url, broker_url)
        forwarder = Forwarder(routes, faults.tmp / "forwarder.log")
        yield reach
    finally:
        faults.workers.stop_all()  # before their namespaces go
        if forwarder is not None:
            forwarder.stop()
        for host in made:
            host.destroy()


def rows(chat: Chat) -> tuple:
    """Everything a writer could change, to compare before and after the cut host heals."""
    fresh = Chat.objects.get(pk=chat.pk)
    return (
        (fresh.state, fresh.lease_token, fresh.updated_at, fresh.error, fresh.attempts),
        list(chat.messages.order_by("id").values_list("id", "role", "status", "content")),
        list(chat.tool_calls.order_by("id").values_list("id", "state", "finished_at")),
        chat.usage_records.count(),
    )


def test_a_host_cut_mid_tool_is_taken_over_and_writes_nothing_after_healing(faults, hosts, user):
    flag = faults.tmp / "flag"
    cut_host, a_database, a_broker = hosts["a"]
    _, b_database, b_broker = hosts["b"]
    a = faults.workers.start(
        "a", netns=cut_host.netns, database_url=a_database, broker_url=a_broker, flag=flag,
        LEASE_SECONDS=LEASE,
    )  # fmt: skip
    chat = faults.send(user, "tools:slow_charge|lookup")
    faults.wait(
        lambda: any(n == "slow_charge" for *_, n in invariants.runs(faults.workers.run_log)),
        "host a to start the slow charge",
    )
    b = faults.workers.start(
        "b", netns=hosts["b"][0].netns, database_url=b_database, broker_url=b_broker,
        flag=flag, LEASE_SECONDS=LEASE,
    )  # fmt: skip

    cut_host.cut()
    cut_at = time.monotonic()
    faults.sweep_every = SWEEP_EVERY
    faults.wait(faults.all_settled, "host b to take the chat over and complete it")
    record_recovery("host partitioned mid-step (lease taken over)", time.monotonic() - cut_at)
    faults.sweep_every = 0
    after_takeover = rows(chat)

    cut_host.heal()
    flag.touch()  # host a's tool finishes now, after the heal
    # Its lease ran out while it was cut off: the step gives up without writing, as "lost"
    # (it saw another token) or "unreachable" (its connection was gone until past the lease).
    faults.wait(
        lambda: {"lost", "unreachable"} & set(a.outcomes()), "host a's job to end without writing"
    )

    assert rows(chat) == after_takeover  # host a wrote nothing after healing
    assert b.outcomes()  # host b did the work after the cut
    charge = chat.tool_calls.get(name="slow_charge")
    assert charge.result.is_error  # cut mid-run, not idempotent: never run again
    faults.check()
