"""The real parts the fault suite breaks, each started and stopped by the test that owns it.

* :class:`RedisServer`: a private ``redis-server`` on a free port (no persistence, like a
  cache-mode Redis): SIGKILL it, start it again on the same port;
* :class:`Workers`: real ``celery worker`` processes (``tests.celery_app``) on the test's
  database and broker, optionally inside a network namespace or with a skewed clock;
* :class:`Host`: a network namespace with a veth pair to the root namespace, whose link the
  test cuts and heals; :class:`Forwarder`: the TCP forwarder that carries its traffic to
  PostgreSQL and Redis (both listen on 127.0.0.1 only);
* :func:`terminate_backends` and :func:`refuse_connections`: faults on the test's own
  database only (never the server: other databases and the machine's service are untouched).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

from tests.helpers import wait_until
from tests.workers import Worker, start_worker, worker_logs

#: seconds any one wait may take before the test fails (generous: a loaded 2-core machine).
DEADLINE = 90.0
POLL = 0.05
IN_CI = os.environ.get("CI") == "true"


def unavailable(reason: str) -> None:
    """Skip, or fail under ``CI=true`` (CI must run the fault suite)."""
    # Function-local: pytest is only needed when a part is missing.
    import pytest

    if IN_CI:
        pytest.fail(f"{reason}; under CI=true the fault suite must run")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], Any], what: str, timeout: float = DEADLINE,
             on_timeout: Callable[[], str] = str) -> Any:  # fmt: skip
    """Poll ``condition`` until it is true; fail saying ``what`` (and ``on_timeout()``)."""
    return wait_until(condition, what, timeout, on_timeout, poll=POLL)


def record_recovery(fault: str, seconds: float) -> None:
    """Note how long recovery from ``fault`` took: printed, and appended as a JSON line to
    ``$AGENTLOOP_FAULT_TIMES`` when set (bench/faults.py takes the medians). Not asserted."""
    print(f"recovery {fault}: {seconds:.2f} s")
    path = os.environ.get("AGENTLOOP_FAULT_TIMES")
    if path:
        with Path(path).open("a") as handle:
            handle.write(json.dumps({"fault": fault, "seconds": round(seconds, 3)}) + "\n")


# -- a private Redis -------------------------------------------------------------------------
class RedisServer:
    """``redis-server`` on a free port of 127.0.0.1, without persistence: a kill loses
    everything it held, queued jobs included, as a cache-mode Redis restarted by a deploy."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def url(self, db: int = 0, host: str = "127.0.0.1", port: int | None = None) -> str:
        return f"redis://{host}:{port or self.port}/{db}"

    def start(self) -> None:
        self.starts += 1
        log = self.workdir / f"redis-{self.port}-{self.starts}.log"
        self.process = subprocess.Popen(  # noqa: S603 - the Debian binary, our arguments
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(log),
            ],  # fmt: skip
            start_new_session=True,
        )
        wait_for(self.answers, f"redis-server on port {self.port} to answer", timeout=30)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing saved."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)


# -- worker processes ------------------------------------------------------------------------
@dataclass
class Workers:
    """The test's queue, its workers and the files every process logs to."""

    tmp: Path
    broker_url: str
    queue: str = field(default_factory=lambda: f"agentloop-faults-{uuid.uuid4().hex[:10]}")
    started: list[Worker] = field(default_factory=list)

    @property
    def run_log(self) -> Path:
        return self.tmp / "runs.log"

    def start(
        self,
        name: str,
        *,
        netns: str | None = None,
        database_url: str | None = None,
        broker_url: str | None = None,
        flag: Path | None = None,
        clock_offset: float = 0.0,
        wait: bool = True,
        **agentloop: Any,
    ) -> Worker:
        """A ``celery worker`` (prefork, one process) on the test's queue and database
        (tests/workers.py starts it).

        ``netns`` runs it in that network namespace; ``database_url`` and ``broker_url``
        point it elsewhere than the test's own (through a forwarder); ``flag`` is the file
        held tools wait for; ``clock_offset`` moves its clock (seconds, time-machine);
        ``agentloop`` settings go on top of the tests' own.
        """
        worker, ready = start_worker(
            self.tmp,
            name,
            queue=self.queue,
            broker_url=broker_url or self.broker_url,
            run_log=self.run_log,
            flag=flag,
            clock_offset=clock_offset,
            netns=netns,
            database_url=database_url,
            agentloop=agentloop,
        )
        self.started.append(worker)
        if wait:
            wait_for(ready.exists, f"worker {name} to be ready", on_timeout=self.logs)
        return worker

    def logs(self) -> str:
        return worker_logs(self.started, 5000)

    def stop_all(self) -> None:
        for worker in self.started:
            worker.kill()


# -- the test's own database -----------------------------------------------------------------
def _admin() -> Any:
    """A connection to the server's maintenance database, outside the test's own: the faults
    are issued from here, so the test's connection is neither the target nor the tool."""
    import psycopg  # the "postgres" extra; these tests run on PostgreSQL only

    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=int(settings["PORT"] or 5432),
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )


def database_name() -> str:
    """The test database's name (the only database the faults touch)."""
    return str(connection.settings_dict["NAME"])


def terminate_backends() -> int:
    """``pg_terminate_backend`` every backend of the test's database but this process's own;
    returns how many were terminated."""
    connection.ensure_connection()
    own = connection.cursor().connection.info.backend_pid
    with _admin() as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> %s AND pid <> pg_backend_pid()",
            [database_name(), own],
        ).fetchall()
    return sum(1 for (done,) in rows if done)


@contextlib.contextmanager
def refuse_connections() -> Iterator[None]:
    """``ALLOW_CONNECTIONS false`` on the test's database (and its backends but ours
    terminated) for the block; always set back to true."""
    name = database_name()
    quoted = '"' + name.replace('"', '""') + '"'
    with _admin() as admin:
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")  # noqa: S608
        try:
            terminate_backends()
            yield
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")  # noqa: S608


# -- network namespaces ----------------------------------------------------------------------
def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)  # noqa: S603,S607


def network_namespaces_available() -> str:
    """Why namespaces can't be made here, or "" when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip",):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode:  # noqa: S603,S607
            return f"`{tool}` (iproute2) is not installed"
    return ""


class Host:
    """A worker "host": a network namespace joined to the root namespace by a veth pair on a
    /30 of its own. :meth:`cut` takes the link down (packets dropped, no error to either
    side's sockets: a partition), :meth:`heal` brings it back."""

    def __init__(self, label: str) -> None:
        tag = secrets.token_hex(3)
        self.netns = f"agentloop-{label}-{tag}"
        self.root_side = f"alr{tag}{label[:2]}"[:15]
        self.host_side = f"alh{tag}{label[:2]}"[:15]
        subnet = secrets.randbelow(250 * 60)
        # 10.232.x.y/30: the root side is .1, the host .2.
        base = (subnet // 60, (subnet % 60) * 4)
        self.root_address = f"10.232.{base[0]}.{base[1] + 1}"
        self.address = f"10.232.{base[0]}.{base[1] + 2}"
        self.prefix = f"10.232.{base[0]}.{base[1]}/30"
        self.created = False

    def create(self) -> None:
        _ip("netns", "add", self.netns)
        self.created = True
        _ip("link", "add", self.root_side, "type", "veth", "peer", "name", self.host_side)
        _ip("link", "set", self.host_side, "netns", self.netns)
        _ip("addr", "add", f"{self.root_address}/30", "dev", self.root_side)
        _ip("link", "set", self.root_side, "up")
        _ip("-n", self.netns, "addr", "add", f"{self.address}/30", "dev", self.host_side)
        _ip("-n", self.netns, "link", "set", self.host_side, "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        # While the link is down the connected route is gone: without this, the root side's
        # packets to the host would leave by the default route instead of being dropped.
        _ip("route", "add", "blackhole", self.prefix, "metric", "4000")

    def cut(self) -> None:
        _ip("link", "set", self.root_side, "down")

    def heal(self) -> None:
        _ip("link", "set", self.root_side, "up")

    def destroy(self) -> None:
        if not self.created:
            return
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("route", "del", "blackhole", self.prefix, "metric", "4000")
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.root_side)  # takes its peer in the namespace with it
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.netns)
        self.created = False


class Forwarder:
    """tests/faults/forwarder.py in the root namespace: ``routes`` is a list of
    ``(listen host, listen port, target host, target port)``."""

    def __init__(self, routes: list[tuple[str, int, str, int]], log: Path) -> None:
        arguments = [f"{lh}:{lp}={th}:{tp}" for lh, lp, th, tp in routes]
        self.log = log
        with log.open("w") as output:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and script
                [sys.executable, str(Path(__file__).with_name("forwarder.py")), *arguments],
                stdout=subprocess.PIPE,
                stderr=output,
                text=True,
                start_new_session=True,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "READY":
            self.stop()
            raise AssertionError(f"the forwarder did not start: {line!r} {log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()
