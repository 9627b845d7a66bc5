"""Tools for tests, importable by path so persisted chats can store them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agentloop import NeedsInput, Tool, ToolError, tool


@tool
def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class Weather(Tool):
    """Gets the current weather for a city."""

    class Params(BaseModel):
        city: str = Field(description="City name")

    def execute(self, city: str) -> dict[str, object]:
        return {"city": city, "temperature_c": 21, "sky": "clear"}


@tool
def refuse(reason: str) -> str:
    """Always fails with a ToolError."""
    raise ToolError(f"refused: {reason}")


@tool
def explode() -> str:
    """Raises an unexpected exception."""
    raise RuntimeError("kaboom")


@tool
def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    time.sleep(seconds)
    return f"slept {seconds}"


#: threads that ran `record` (concurrency tests read it).
RECORDED_THREADS: list[str] = []
_lock = threading.Lock()


@tool
def record(label: str, seconds: float = 0.0) -> str:
    """Notes which thread ran it."""
    time.sleep(seconds)
    with _lock:
        RECORDED_THREADS.append(threading.current_thread().name)
    return label


def _log_run(name: str) -> None:
    """Append a line to $AGENTLOOP_TEST_RUN_LOG so tests can count runs across processes."""
    path = os.environ.get("AGENTLOOP_TEST_RUN_LOG")
    if path:
        with Path(path).open("a") as handle:
            handle.write(f"{name}\n")
            handle.flush()
            os.fsync(handle.fileno())


@tool
def step_one() -> str:
    """First of three."""
    _log_run("step_one")
    return "one done"


@tool
def step_two() -> str:
    """Second of three; dies with os._exit when $AGENTLOOP_TEST_CRASH_IN is "step_two"."""
    _log_run("step_two")
    if os.environ.get("AGENTLOOP_TEST_CRASH_IN") == "step_two":
        os._exit(17)
    return "two done"


@tool
def step_three() -> str:
    """Third of three."""
    _log_run("step_three")
    return "three done"


@tool(idempotent=False)
def charge_card(amount: int) -> str:
    """Charges a card; not safe to repeat. Dies mid-run when $AGENTLOOP_TEST_CRASH_IN says so."""
    _log_run("charge_card")
    if os.environ.get("AGENTLOOP_TEST_CRASH_IN") == "charge_card":
        os._exit(17)
    return f"charged {amount}"


class CancelChat(Tool):
    """Asks its own chat to cancel (as a user pressing "stop" mid-round would), then answers."""

    def execute(self) -> str:
        self.context.chat.cancel()
        return "cancel requested"


class CancelViaDatabase(Tool):
    """Requests cancellation through a second instance loaded from the database (as another
    worker or a web view would), then answers."""

    def execute(self) -> str:
        chat = self.context.chat
        type(chat).objects.get(pk=chat.pk).cancel()
        return "cancel requested"


class RecordedWeather(Tool):
    """The "weather" tool of the recorded provider traffic (tests/providers/cassettes.py):
    same name, description and schema, same answer, so replayed conversations match."""

    name = "weather"
    description = "Gets current weather for a location"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")

        latitude: str = Field(description="Latitude (e.g., 52.5200)")
        longitude: str = Field(description="Longitude (e.g., 13.4050)")

    def execute(self, latitude: str, longitude: str) -> str:
        return f"Current weather at {latitude}, {longitude}: 15°C, Wind: 10 km/h"


def _hold_until_flag() -> None:
    """Block while $AGENTLOOP_TEST_FLAG names a file that doesn't exist (at most 2 minutes):
    a worker killed meanwhile never finishes the tool; one started without the variable does."""
    flag = os.environ.get("AGENTLOOP_TEST_FLAG")
    deadline = time.monotonic() + 120
    while flag and not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@tool
def wait_for_flag() -> str:
    """Logs its run, then holds until $AGENTLOOP_TEST_FLAG exists (see _hold_until_flag)."""
    _log_run("wait_for_flag")
    _hold_until_flag()
    return "flag seen"


@tool(idempotent=False)
def charge_card_slowly(amount: int) -> str:
    """Charges a card (not safe to repeat), then holds until $AGENTLOOP_TEST_FLAG exists."""
    _log_run("charge_card_slowly")
    _hold_until_flag()
    return f"charged {amount}"


# -- people in the loop (tests/test_people_in_the_loop.py, tests/test_agents.py) -------------
@tool(requires_approval=True)
def transfer(amount: int, to: str) -> str:
    """Transfers money; runs only once a person approves these exact arguments."""
    _log_run("transfer")
    return f"sent {amount} to {to}"


def _large_amount(arguments: dict[str, object]) -> bool:
    amount = arguments.get("amount", 0)
    return not isinstance(amount, int) or amount > 100


@tool(requires_approval=_large_amount)
def refund(amount: int) -> str:
    """Refunds an amount; amounts over 100 wait for a person's approval."""
    _log_run("refund")
    return f"refunded {amount}"


def _broken_rule(arguments: dict[str, object]) -> bool:
    raise RuntimeError("the approval rule has a bug")


@tool(requires_approval=_broken_rule)
def archive(name: str) -> str:
    """Archives a record; its approval rule fails, so every call waits (fail closed)."""
    _log_run("archive")
    return f"archived {name}"


class Wire(Tool):
    """A Tool class that always needs approval."""

    requires_approval = True

    class Params(BaseModel):
        iban: str

    def execute(self, iban: str) -> str:
        _log_run("wire")
        return f"wired to {iban}"


@tool
def ask_manager(question: str) -> str:
    """Asks the manager; the call waits for a person's answer."""
    raise NeedsInput(question)


# -- the chaos test (tests/test_chaos.py) ------------------------------------------------------
class _ChaosTool(Tool):
    """Logs ``<chat pk>:<call id>:<pid>`` to $AGENTLOOP_TEST_RUN_LOG as it starts, then sleeps
    $AGENTLOOP_TEST_CHAOS_SLEEP seconds (default 0.3) so that kills sometimes land mid-tool."""

    def execute(self) -> str:
        _log_run(f"{self.context.chat.pk}:{self.tool_call.id}:{os.getpid()}")
        time.sleep(float(os.environ.get("AGENTLOOP_TEST_CHAOS_SLEEP", "0.3")))
        return f"{self.name} done"


class ChaosA(_ChaosTool):
    """First tool of the chaos round."""

    name = "chaos_a"


class ChaosB(_ChaosTool):
    """Second tool of the chaos round; not idempotent, so a cut run is never run again."""

    name = "chaos_b"
    idempotent = False


class ChaosC(_ChaosTool):
    """The tool of the chaos test's second round."""

    name = "chaos_c"


# -- connection faults (tests/test_connection_faults.py) ----------------------------------------
@tool
def drop_connection() -> str:
    """Logs its run, then has PostgreSQL drop the connection of the step running it (the
    thread's own), as a server restart or a network cut would while a tool runs."""
    # Function-local: the fault helpers need psycopg, present only on PostgreSQL runs.
    from tests.db_faults import backend_pid, terminate

    _log_run("drop_connection")
    terminate(backend_pid())
    return "connection dropped"


@tool
def lose_reply() -> str:
    """Logs its run, then has the test's proxy lose the server's next answer to this process:
    the answer to this call's result write, sent after the write committed."""
    # Function-local: the fault helpers need psycopg, present only on PostgreSQL runs.
    from tests.db_faults import lose_next_reply

    _log_run("lose_reply")
    lose_next_reply()
    return "reply lost"


#: how long ``outlast_the_lease`` has the database refuse connections (seconds): longer
#: than the lease of the tests that call it.
OUTAGE = 4.0
#: the threads of its outages (a test joins them before its database is flushed).
OUTAGES: list[threading.Thread] = []


@tool
def outlast_the_lease() -> str:
    """Logs its run, then has the test database refuse connections for ``OUTAGE`` seconds
    (every open one dropped, the step's too) and returns during that: its result's write
    can't be made before the step's lease runs out."""
    # Function-local: the fault helpers need psycopg, present only on PostgreSQL runs.
    from tests.db_faults import refusing_connections

    _log_run("outlast_the_lease")
    started = threading.Event()

    def outage() -> None:
        with refusing_connections():
            started.set()
            time.sleep(OUTAGE)

    thread = threading.Thread(target=outage, daemon=True)
    OUTAGES.append(thread)
    thread.start()
    started.wait(30)
    return "computed during the outage"


@tool
def lookup(key: str) -> str:
    """Looks a key up (the tool of tests/test_in_flight.py's chats: instant, deterministic).

    Args:
        key: What to look up.
    """
    return f"value of {key}"
