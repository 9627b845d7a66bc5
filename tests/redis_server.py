"""A private ``redis-server`` a test owns: started on a free port, paused, restarted, killed.

Fault tests break only what they own: never the machine's Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: seconds a server gets to start listening.
START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process of the test's own, with no persistence."""

    def __init__(self, directory: Path, preexec: Callable[[], None] | None = None) -> None:
        self.directory = directory
        self.preexec = preexec
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    def url(self, **options: Any) -> str:
        query = "&".join(f"{key}={value}" for key, value in options.items())
        return f"redis://127.0.0.1:{self.port}/0" + (f"?{query}" if query else "")

    def start(self) -> None:
        with (self.directory / f"redis-{self.port}.log").open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - the machine's redis-server
                [str(shutil.which("redis-server")), "--port", str(self.port),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.directory)],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=self.preexec,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, nothing is answered."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True
        stat = Path(f"/proc/{self.process.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            time.sleep(0.01)  # the signal is delivered when the server is next scheduled

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            if self.paused:
                self.resume()
            self.process.kill()
            self.process.wait(timeout=30)

    def restart(self) -> None:
        """Killed and started again on the same port (every connection to it drops)."""
        self.stop()
        self.start()

    def client(self) -> Any:
        import redis  # the "redis" extra is a dev dependency

        return redis.Redis.from_url(self.url(), socket_connect_timeout=5)

    def connections_of(self, pid: int) -> list[dict[str, Any]]:
        """CLIENT LIST entries of the connections process ``pid`` holds to this server (by
        the client-side ports of its sockets, read from /proc)."""
        ports = _local_ports(pid, self.port)
        with self.client() as client:
            return [c for c in client.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports]


def _local_ports(pid: int, remote_port: int) -> set[int]:
    """Local ports of the TCP sockets of ``pid`` connected to ``remote_port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@contextmanager
def private_redis(directory: Path) -> Iterator[RedisServer]:
    """A started private server, killed at the end (resumed first if paused)."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed; under CI=true these tests must run")
        pytest.skip("redis-server is not installed")
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
