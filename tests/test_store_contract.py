"""One contract suite for every ``ChatStore`` (issue 25), as Django runs one session test
mixin against every session backend: each test is written once and runs against the
in-memory store (``memory``) and the Django store (``django``, on the test database).

The tests pin what the engine relies on (``agentloop/engine/store.py``'s docstrings and
its callers in the engine), never a store's internals: they act through a store's parts
(``store.transcript``, ``store.tool_calls``...) and read back through them, or through the
small adapters of ``tests/store_contract/harness.py`` where the stores legitimately differ
(records are model rows or Messages; another writer is another thread or another process). A
divergence that breaks the contract is marked with ``breaks(store, reason)``: a strict xfail
for that store only. Each test class names the part it pins (``part = "inbox"``); for a
store that leaves an optional part out (the in-memory store has no ``transactions``), that
class is skipped, and ``TestParts`` pins which parts each store has.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentloop.engine.store import (
    OPTIONAL_PARTS,
    Configuration,
    RunClaim,
    Stopping,
    ToolCalls,
    Transcript,
)
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
    "TestParts",
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
    made = MemoryHarness() if name == "memory" else DjangoHarness()
    part = getattr(request.cls, "part", None)
    if part in OPTIONAL_PARTS and getattr(made.store, part) is None:
        pytest.skip(f"the {name} store leaves out store.{part}")
    yield made


#: the optional parts each store leaves out (None): the in-memory store has no database to
#: share, no budgets and no memories across chats; the Django store's budgets are there when
#: AGENTLOOP["BUDGETS"] is set (test_budgets.py), not in these tests' settings.
LEFT_OUT = {"memory": {"transactions", "budgets", "memory"}, "django": {"budgets"}}


class TestParts:
    """Every store has the five parts the engine always calls, each implementing its
    interface; an optional part is its interface's implementation or None."""

    def test_the_parts_implement_their_interfaces(self, harness: Harness) -> None:
        store = harness.store
        required = {
            "config": Configuration, "runs": RunClaim, "transcript": Transcript,
            "tool_calls": ToolCalls, "stopping": Stopping,
        }  # fmt: skip
        for name, interface in required.items():
            assert isinstance(getattr(store, name), interface), name
        for name, interface in OPTIONAL_PARTS.items():
            part = getattr(store, name)
            assert part is None or isinstance(part, interface), name
        left_out = {name for name in OPTIONAL_PARTS if getattr(store, name) is None}
        assert left_out == LEFT_OUT[harness.name]
