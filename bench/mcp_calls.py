"""What one MCP tool call costs: sessions kept open (what agentloop does) or one per call.

    python bench/mcp_calls.py [--samples N]

Starts the tests' MCP server (tests/mcp_server.py) over stdio and over streamable HTTP on
127.0.0.1, and times the ``add`` tool:

* ``kept open``: ``MCPTool.execute()`` from synchronous code, on the session agentloop keeps
  open on its background event loop (after one warm-up call that opens it);
* ``first call``: the same on a fresh process state, connecting included (closed after);
* ``one session per call``: ``asyncio.run()`` of open client, call, close (the alternative
  design), from synchronous code too.

Figures are medians in milliseconds. No database is used.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(work: Callable[[], Any], samples: int) -> float:
    """Median wall time of ``work()`` in milliseconds."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    options = parser.parse_args()

    import django
    from django.conf import settings

    entries: dict[str, dict[str, Any]] = {}  # filled in once the HTTP server has a port
    settings.configure(
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "agentloop"],
        AGENTLOOP={"MCP_SERVERS": entries},
    )
    django.setup()
    # Local: the test helpers import the models, which need the settings above.
    from tests.mcp_servers import SERVER_SCRIPT, HttpServer

    with tempfile.TemporaryDirectory() as directory:
        http = HttpServer.start(Path(directory))
        try:
            entries["stdio"] = {"command": [sys.executable, str(SERVER_SCRIPT), "stdio"]}
            entries["http"] = {"url": http.url}
            report(entries, options.samples)
        finally:
            http.stop()


def report(entries: dict[str, dict[str, Any]], samples: int) -> None:
    from mcp import Client, StdioServerParameters

    from agentloop.tools.mcp import close_connections, mcp_tools

    print(f"{'transport':<10}{'kept open':>12}{'first call':>12}{'session per call':>18}")
    for name, entry in entries.items():
        (add,) = mcp_tools(name, only=["add"])
        close_connections()

        def call(tool: Any = add) -> None:
            tool().execute(a=1, b=2)

        def first_call() -> None:
            call()
            close_connections()

        first = timed(first_call, max(3, samples // 10))
        call()  # opens the session the next samples reuse
        kept = timed(call, samples)
        close_connections()

        target: Any = (
            StdioServerParameters(command=entry["command"][0], args=entry["command"][1:])
            if "command" in entry
            else entry["url"]
        )

        async def one_session(target: Any = target) -> None:
            async with Client(target) as client:
                await client.call_tool("add", {"a": 1, "b": 2})

        per_call = timed(lambda: asyncio.run(one_session()), max(3, samples // 10))
        print(f"{name:<10}{kept:>10.2f}ms{first:>10.1f}ms{per_call:>16.1f}ms")


if __name__ == "__main__":
    main()
