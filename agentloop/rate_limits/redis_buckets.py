"""Rate-limit buckets in Redis: one Lua script takes from every bucket of a call, or from
none, by Redis's own clock (every process agrees on it).

Each bucket is a hash (``level``, ``stamp``) under ``<REDIS_PREFIX>:ratelimit:<bucket>``
that expires once it would be full again. If Redis can't be reached the call goes without
waiting (a warning is logged): the provider's own limit, and the retries of a 429, still
hold.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..engine.rate_limiting import Bucket, RateLimiter, Shortfall
from ..process.redis_client import client, prefix

__all__ = ["RedisRateLimiter"]

logger = logging.getLogger(__name__)

#: KEYS: the buckets; ARGV: capacity, refill per second and cost of each, in order. Returns
#: {"0", 0} when taken, else {seconds to wait, the index of the bucket furthest from room}.
TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local levels = {}
local worst, worst_index = 0, 0
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[i * 3 - 2])
  local rate = tonumber(ARGV[i * 3 - 1])
  local cost = tonumber(ARGV[i * 3])
  local state = redis.call('HMGET', key, 'level', 'stamp')
  local level = tonumber(state[1]) or capacity
  local elapsed = math.max(0, now - (tonumber(state[2]) or now))
  level = math.min(capacity, level + elapsed * rate)
  if level >= math.min(cost, capacity) then
    levels[i] = level - cost
  else
    local wait = (math.min(cost, capacity) - level) / rate
    if wait > worst then worst, worst_index = wait, i end
  end
end
if worst_index > 0 then return {tostring(worst), worst_index} end
for i, key in ipairs(KEYS) do
  local capacity, rate = tonumber(ARGV[i * 3 - 2]), tonumber(ARGV[i * 3 - 1])
  redis.call('HSET', key, 'level', tostring(levels[i]), 'stamp', tostring(now))
  -- gone once it would be full again: a missing bucket reads as full
  redis.call('EXPIRE', key, math.ceil((capacity - levels[i]) / rate) + 1)
end
return {'0', 0}
"""

#: seconds between two warnings that Redis can't be reached.
_WARN_EVERY = 60.0


class RedisRateLimiter(RateLimiter):
    """The buckets in ``REDIS_URL``'s Redis."""

    def __init__(self) -> None:
        self._scripts: dict[int, Any] = {}
        self._warned = float("-inf")

    def key(self, bucket: Bucket) -> str:
        return f"{prefix()}:ratelimit:{bucket.key}"

    def take(self, buckets: list[Bucket]) -> Shortfall | None:
        # Function-local: redis is the optional "redis" extra (only sites using it load it).
        import redis

        connection = client()
        script = self._scripts.get(id(connection))
        if script is None:
            script = self._scripts[id(connection)] = connection.register_script(TAKE)
        args: list[float] = []
        for bucket in buckets:
            args += [bucket.capacity, bucket.per_second, bucket.cost]
        try:
            seconds, index = script(keys=[self.key(bucket) for bucket in buckets], args=args)
        except redis.RedisError as exc:
            now = time.monotonic()
            if now - self._warned >= _WARN_EVERY:
                self._warned = now
                logger.warning("Rate limits: Redis can't be reached (%s); calls go unpaced", exc)
            return None
        if int(index) == 0:
            return None
        return Shortfall(float(seconds), buckets[int(index) - 1])
