"""Fleet rate limits as token buckets, and what a model call is counted for before it answers.

A call's estimate: its input at about four characters a token, its output at the request's
``max_output_tokens`` (else ``ESTIMATED_OUTPUT_TOKENS``), and the price of both from the
provider (None when the provider doesn't know the model's). Budgets reserve the estimate's
cost and tokens (the usage row then settles them to the exact figures); the
tokens-per-minute buckets take its tokens.

``AGENTLOOP["RATE_LIMITS"]`` sets the pace per provider or model: ``{"openai":
{"requests_per_minute": 500, "tokens_per_minute": 200_000}, "openai:gpt-4.1":
{"requests_per_minute": 100}}``. A call takes from the buckets of its model and of its
provider (requests: 1 each; tokens: its estimate), from all of them or from none. A bucket
holds a minute's worth and refills continuously; a call bigger than a whole bucket goes when
the bucket is full (and leaves it in debt), so it is slowed, never refused forever.

The limiters every process shares (Redis, the database) are the Django layer's
(:mod:`agentloop.rate_limits`); :class:`MemoryRateLimiter` paces the chats of one process
(``agentloop.chat()``).
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal

from ..conf import agentloop_settings
from ..messages import ModelRequest, TokenUsage, checked_cost
from ..providers.base import Provider
from .compaction import estimate_tokens

__all__ = [
    "Bucket",
    "CallEstimate",
    "MemoryRateLimiter",
    "RateLimiter",
    "Shortfall",
    "buckets_for",
    "estimate_call",
    "take",
]


#: what each RATE_LIMITS field counts, as a wait shows it.
_KINDS = {"requests_per_minute": "requests", "tokens_per_minute": "tokens"}


@dataclass(frozen=True)
class Bucket:
    """One bucket a call takes from: its key, size, refill rate and what this call costs."""

    #: "openai/requests", "openai:gpt-4.1/tokens".
    key: str
    #: a minute's worth.
    capacity: float
    #: refill per second.
    per_second: float
    #: what this call takes (1 request, or its estimated tokens).
    cost: float

    @property
    def label(self) -> str:
        """How a wait names it: "openai requests per minute"."""
        name, _, kind = self.key.rpartition("/")
        return f"{name} {kind} per minute"


@dataclass(frozen=True)
class Shortfall:
    """A call that must wait: how long until every bucket may have room, and the bucket
    that is the furthest from it."""

    seconds: float
    bucket: Bucket


def buckets_for(provider: str, model: str, tokens: int) -> list[Bucket]:
    """The buckets a call of ``provider:model`` estimated at ``tokens`` takes from, in key
    order (the order the database takes their rows in: no two calls deadlock)."""
    limits = agentloop_settings.RATE_LIMITS
    if not limits:
        return []
    found = []
    for key in (f"{provider}:{model}", provider):
        entry = limits.get(key)
        if entry is None:
            continue
        for field, kind in _KINDS.items():
            per_minute = getattr(entry, field)
            if per_minute:
                cost = 1.0 if kind == "requests" else float(max(tokens, 1))
                found.append(Bucket(f"{key}/{kind}", float(per_minute), per_minute / 60.0, cost))
    return sorted(found, key=lambda bucket: bucket.key)


def take(level: float, elapsed: float, bucket: Bucket) -> tuple[float, float]:
    """A bucket at ``level`` ``elapsed`` seconds ago: its level now after this call took from
    it, and 0; or, when it has no room, its level now untouched and the seconds until it
    has."""
    now_level = min(bucket.capacity, level + max(elapsed, 0.0) * bucket.per_second)
    if now_level >= bucket.cost or now_level >= bucket.capacity:
        return now_level - bucket.cost, 0.0
    return now_level, (min(bucket.cost, bucket.capacity) - now_level) / bucket.per_second


class RateLimiter(ABC):
    """Where the buckets live. One method: take from all, or say how long to wait."""

    @abstractmethod
    def take(self, buckets: list[Bucket]) -> Shortfall | None:
        """Take each bucket's cost from it, all or none, atomically: None when taken, else
        how long until they may all have room (nothing was taken)."""


class MemoryRateLimiter(RateLimiter):
    """Buckets in this process's memory (one process's chats share them)."""

    def __init__(self) -> None:
        self._levels: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, buckets: list[Bucket]) -> Shortfall | None:
        now = time.monotonic()
        with self._lock:
            after: dict[str, tuple[float, float]] = {}
            short: Shortfall | None = None
            for bucket in buckets:
                level, stamp = self._levels.get(bucket.key, (bucket.capacity, now))
                level, wait = take(level, now - stamp, bucket)
                after[bucket.key] = (level, now)
                if wait > 0 and (short is None or wait > short.seconds):
                    short = Shortfall(wait, bucket)
            if short is None:
                self._levels.update(after)
            return short


_memory = MemoryRateLimiter()


def memory_limiter() -> MemoryRateLimiter:
    """This process's limiter (the in-memory chats')."""
    return _memory


@dataclass(frozen=True)
class CallEstimate:
    """A model call as counted before it answers."""

    #: the name the provider is registered under, and the model id.
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    #: the price of the estimate; None when the provider doesn't know the model's prices.
    cost: Decimal | None

    def __post_init__(self) -> None:
        # What a budget reserves: a provider's price is checked as a usage row's is.
        object.__setattr__(self, "cost", checked_cost(self.cost, self.model))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def estimate_call(provider: Provider, provider_name: str, request: ModelRequest) -> CallEstimate:
    """The estimate of ``request`` to ``provider`` (registered as ``provider_name``)."""
    tools = sum(
        len(tool.name) + len(tool.description) + len(json.dumps(tool.parameters, default=str))
        for tool in request.tools
    )
    input_tokens = estimate_tokens(request.messages) + tools // 4
    output_tokens = request.max_output_tokens or agentloop_settings.ESTIMATED_OUTPUT_TOKENS
    usage = TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    return CallEstimate(
        provider=provider_name,
        model=request.model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=provider.cost(request.model, usage),
    )
