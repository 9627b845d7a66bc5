"""The Redis server the suite talks to: ``AGENTLOOP_TEST_REDIS`` (``host:port``, by default
the machine's own, 127.0.0.1:6379). CI runs the suite on two Pythons at once, the second on a
private ``redis-server`` of its own, so neither run's flushes and queues reach the other's."""

from __future__ import annotations

import os

__all__ = ["ADDRESS", "redis_url"]

#: ``host:port`` of the suite's Redis.
ADDRESS = os.environ.get("AGENTLOOP_TEST_REDIS", "127.0.0.1:6379")


def redis_url(database: int) -> str:
    """The URL of ``database`` (0-15) on the suite's Redis."""
    return f"redis://{ADDRESS}/{database}"
