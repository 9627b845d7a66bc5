"""The Redis server the suite talks to: one it starts itself, so it never flushes a server it
doesn't own.

On first import in a test run (tests/conftest.py imports it), a ``redis-server`` is started
on a free port of 127.0.0.1 with no persistence, owned by this pytest process (it stops when
the process ends, however it ends), and its address is put in ``AGENTLOOP_TEST_REDIS`` so
every process the tests start (Celery workers, servers, scripts) inherits it instead of
starting one of its own. Each pytest process (each of ``pytest -n``'s) has its own server.

``AGENTLOOP_TEST_REDIS=host:port`` points the suite at a server that exists instead: the
suite then empties databases 1 to 15 of it, so give it one that holds nothing else. Without
``redis-server`` on the PATH and without that variable, :data:`MISSING` says why and the tests
that need Redis skip (fail under ``CI=true``).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

__all__ = ["ADDRESS", "MISSING", "redis_url"]

_ENV = "AGENTLOOP_TEST_REDIS"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # PR_SET_PDEATHSIG: the server gets SIGTERM when the pytest process ends, even by SIGKILL.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _start_own() -> str:
    # Function-local: the processes the tests start import this module too, and never start one.
    from tests.redis_server import RedisServer

    folder = Path(tempfile.mkdtemp(prefix="agentloop-test-redis-"))
    server = RedisServer(folder, preexec=_die_with_parent if sys.platform == "linux" else None)
    server.start()

    def stop() -> None:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    address = f"127.0.0.1:{server.port}"
    os.environ[_ENV] = address
    return address


#: why the suite has no Redis ("" when it has one).
MISSING = ""
if os.environ.get(_ENV):
    ADDRESS = os.environ[_ENV]
elif shutil.which("redis-server"):
    ADDRESS = _start_own()
else:
    ADDRESS = "127.0.0.1:1"  # nothing listens there: the Redis tests skip with MISSING's reason
    MISSING = (
        "redis-server is not installed (apt-get install redis-server), and AGENTLOOP_TEST_REDIS "
        "names no server"
    )


def redis_url(database: int) -> str:
    """The URL of ``database`` (0-15) on the suite's Redis."""
    return f"redis://{ADDRESS}/{database}"
