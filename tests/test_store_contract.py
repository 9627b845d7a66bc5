"""One contract suite for every ``ChatStore`` (issue 25), as Django runs one session test
mixin against every session backend: each test is written once and runs against the
in-memory store (``memory``) and the Django store (``django``, on the test database).

The tests pin what the engine relies on (``agentloop/engine/store.py``'s docstrings and
its callers in the engine), never a store's internals: they act through ``ChatStore`` and
read back through it, or through the small adapters of ``tests/store_contract/harness.py``
where the stores legitimately differ (records are model rows or Messages; another writer is
another thread or another process). A divergence that breaks the contract is marked with
``breaks(store, reason)``: a strict xfail for that store only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.store_contract.config_claims import TestClaim, TestConfig
from tests.store_contract.editing import TestFork, TestSupersede
from tests.store_contract.harness import DjangoHarness, Harness, MemoryHarness
from tests.store_contract.inbox_usage_tracing import TestHooks, TestInbox, TestTracing, TestUsage
from tests.store_contract.stopping import TestCancel, TestCancelHeld, TestHalt
from tests.store_contract.tool_calls import (
    TestDecisions,
    TestHandoffs,
    TestReleasingWrites,
    TestToolCalls,
    TestToolTransactions,
)
from tests.store_contract.transcript import TestAnswers, TestPartials, TestTranscript

__all__ = [
    "TestAnswers",
    "TestCancel",
    "TestCancelHeld",
    "TestClaim",
    "TestConfig",
    "TestDecisions",
    "TestFork",
    "TestHandoffs",
    "TestHalt",
    "TestHooks",
    "TestInbox",
    "TestPartials",
    "TestReleasingWrites",
    "TestSupersede",
    "TestToolCalls",
    "TestToolTransactions",
    "TestTracing",
    "TestTranscript",
    "TestUsage",
]


@pytest.fixture(params=["memory", pytest.param("django", marks=pytest.mark.django_db)])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """A new chat in each store; a test marked ``breaks(store, reason)`` is a strict xfail
    for that store."""
    name = request.param
    reason = getattr(request.function, "breaks", {}).get(name)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    yield MemoryHarness() if name == "memory" else DjangoHarness()
