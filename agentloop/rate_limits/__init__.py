"""The fleet's rate limits (``AGENTLOOP["RATE_LIMITS"]``, docs/budgets.md): token buckets every
process shares, in Redis when ``REDIS_URL`` is set (one Lua script takes from a call's
buckets atomically), else in the database (a row per bucket, taken by conditional UPDATEs in
one transaction). The buckets' arithmetic and the seam are the engine's
(:mod:`agentloop.engine.rate_limiting`)."""

from __future__ import annotations

from ..conf import agentloop_settings
from ..engine.rate_limiting import RateLimiter
from ..process.redis_client import redis_url
from .database_buckets import DatabaseRateLimiter
from .redis_buckets import RedisRateLimiter

__all__ = ["DatabaseRateLimiter", "RedisRateLimiter", "fleet_limiter"]

_database = DatabaseRateLimiter()
_redis = RedisRateLimiter()


def fleet_limiter() -> RateLimiter | None:
    """The limiter of persisted chats: Redis's when ``REDIS_URL`` is set, else the
    database's; None when no rate limits are set."""
    if not agentloop_settings.RATE_LIMITS:
        return None
    return _redis if redis_url() else _database
