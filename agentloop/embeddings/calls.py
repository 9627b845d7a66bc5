"""One ``embed()`` call: the provider and wire resolved, the inputs cut into the API's batches,
each request paced by the fleet's rate limits, bounded by the call deadline, retried as a
model call is (``MODEL_RETRIES``, the one backoff policy), and a usage row recorded for
every attempt, failed ones included (through the ``record`` function the caller gives).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from .. import providers
from ..attachments import Attachment
from ..conf import agentloop_settings
from ..engine._drivers import call_timeout
from ..engine._effects import retry_delay
from ..engine.rate_limiting import RateLimiter, buckets_for
from ..engine.store import UsageRecord
from ..exceptions import ConfigurationError, ProviderError, ProviderTimeout
from ..messages import TokenUsage
from ..providers import watchdog
from ..providers.base import Provider
from .vendors import EMBEDDING_BUILTINS
from .wires import Parsed, Parts, Wire, batches, no_embeddings, wire_for

__all__ = ["Embedding", "Embeddings", "Recorder", "inputs_of", "resolve"]

T = TypeVar("T")

#: writes one attempt's usage row (the Django layer's), or None: nothing is written.
Recorder = Callable[[UsageRecord], None]
#: longest sleep between two looks at a rate limit's buckets (seconds).
_SLICE = 0.25


@dataclass(frozen=True)
class Embeddings:
    """The vectors of one ``embed()`` call, in the order of its inputs, with what it used.

    ``model`` is ``"provider:model"``; ``input_tokens`` and ``cost`` sum the call's requests
    (``cost`` None when a price is unknown). Iterating, indexing and ``len()`` go over
    ``vectors``; ``vector`` is the only one of a call given one text."""

    vectors: list[list[float]]
    model: str
    input_tokens: int = 0
    cost: Decimal | None = None
    dimensions: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dimensions", len(self.vectors[0]) if self.vectors else 0)

    @property
    def vector(self) -> list[float]:
        """The vector of a call given one input."""
        if len(self.vectors) != 1:
            raise ValueError(f"this call embedded {len(self.vectors)} inputs: read .vectors")
        return self.vectors[0]

    def __len__(self) -> int:
        return len(self.vectors)

    def __iter__(self) -> Iterator[list[float]]:
        return iter(self.vectors)

    def __getitem__(self, index: int) -> list[float]:
        return self.vectors[index]


def inputs_of(texts: Any) -> tuple[list[Parts], bool]:
    """Each input's parts, and whether one input was given (not a list): a string or an
    Attachment is one input; a list holds inputs, each a string, an Attachment, or a list
    of them (text and images embedded as one vector). ValueError names what is wrong."""
    single = isinstance(texts, str | Attachment)
    items = [texts] if single else texts
    if not isinstance(items, list | tuple):
        raise ValueError(f"embed() takes a string or a list of strings, not {type(texts).__name__}")
    if not items:
        raise ValueError("embed() was given no inputs")
    inputs: list[Parts] = []
    for position, item in enumerate(items):
        parts = tuple(item) if isinstance(item, list | tuple) else (item,)
        if not parts or any(not isinstance(part, str | Attachment) for part in parts):
            raise ValueError(
                f"embed() input {position} is not a string, an Attachment or a list of them"
            )
        if not any(isinstance(part, Attachment) or part.strip() for part in parts):
            raise ValueError(f"embed() input {position} is empty")
        inputs.append(parts)
    return inputs, single


def resolve(model: str, provider: str | None = None) -> tuple[Provider, str, str, Wire]:
    """The provider, its name, the model id and the wire for ``model`` (``"provider:model"``).

    A provider registered or configured under the name serves the embeddings when it can.
    Otherwise the embedding built-ins (:data:`~.vendors.EMBEDDING_BUILTINS`: Cohere,
    Mistral, Perplexity, and ``offline``'s hash embeddings beside the chat ``offline``
    provider of the tests and the demo) are made on first use; else the chat built-ins."""
    name, model_id = providers.split_model(model, provider)
    builtin = EMBEDDING_BUILTINS.get(name)
    if builtin is None or name in providers.available():
        found = providers.get(name)
        wire = wire_for(found, model_id)
        if wire is not None:
            return found, name, model_id, wire
        if builtin is None:
            raise no_embeddings(name, found)
    with _lock:
        made = _made.get(name)
        if made is None:
            made = _made[name] = builtin(name=name)
    wire = wire_for(made, model_id)
    if wire is None:  # pragma: no cover - every built-in embeds
        raise no_embeddings(name, made)
    return made, name, model_id, wire


#: the embedding built-ins made so far, by name.
_made: dict[str, Provider] = {}
_lock = threading.Lock()


def _estimate(inputs: list[Parts]) -> int:
    """Tokens a request is paced by (about four characters a token; an image about 258)."""
    return sum(
        (len(part) // 4 + 1) if isinstance(part, str) else 258 for parts in inputs for part in parts
    )


def _checked_dimensions(dimensions: Any) -> int | None:
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise ConfigurationError(
            f"dimensions must be a whole number of at least 1, not {dimensions!r}"
        )
    return dimensions


async def _on_the_orm_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on the thread Django's async ORM calls use in this context (a
    request's thread under ASGI), as a persisted chat's database phases run: a usage row or
    a rate limit's bucket never opens a connection on a thread nobody closes."""
    return await sync_to_async(function, thread_sensitive=True)(*args)


class Embedding:
    """One ``embed()`` call's plan: where it goes, how its usage is recorded and paced."""

    def __init__(
        self,
        model: str,
        dimensions: int | None = None,
        *,
        provider: str | None = None,
        record: Recorder | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.provider, self.provider_name, self.model_id, self.wire = resolve(model, provider)
        self.dimensions = _checked_dimensions(dimensions)
        self.record = record
        self.limiter = limiter

    @property
    def label(self) -> str:
        return f"{self.provider_name}:{self.model_id}"

    # -- the pieces both runs share ---------------------------------------------------------
    def _waits(self, inputs: list[Parts]) -> Iterator[float]:
        """The sleeps before a request may go (the rate limits' buckets; none when none)."""
        buckets = buckets_for(self.provider_name, self.model_id, _estimate(inputs))
        if self.limiter is None or not buckets:
            return
        started = time.monotonic()
        timeout = call_timeout(self.provider_name)
        while (short := self.limiter.take(buckets)) is not None:
            if timeout is not None and time.monotonic() - started + short.seconds > timeout:
                raise ProviderTimeout(
                    f"{self.label}: waited for the rate limit ({short.bucket.label}) longer "
                    f"than the call's {timeout:g} s deadline (MODEL_CALL_TIMEOUT)"
                )
            yield min(short.seconds, _SLICE)

    def _usage(
        self, parsed: Parsed | None, inputs: list[Parts], error: Exception | None, started: float
    ) -> UsageRecord:
        """The usage row of one attempt: a success's tokens as reported (else estimated) and
        its reported cost, else the provider's price; a failure's error."""
        usage, cost = TokenUsage(), None
        if parsed is not None:
            tokens = _estimate(inputs) if parsed.input_tokens is None else parsed.input_tokens
            usage = TokenUsage(input_tokens=tokens)
            cost = parsed.cost if parsed.cost is not None else self.provider.cost(
                self.model_id, usage
            )  # fmt: skip
        return UsageRecord(
            provider=self.provider_name,
            model=self.model_id,
            status="succeeded" if error is None else "failed",
            usage=usage,
            cost=cost,
            error="" if error is None else f"{type(error).__name__}: {error}"[:2000],
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    def _result(self, records: list[tuple[Parsed, UsageRecord]]) -> Embeddings:
        known = [usage.cost for _, usage in records if usage.cost is not None]
        return Embeddings(
            vectors=[vector for parsed, _ in records for vector in parsed.vectors],
            model=self.label,
            input_tokens=sum(usage.usage.input_tokens for _, usage in records),
            cost=sum(known, Decimal(0)) if len(known) == len(records) else None,
        )

    def _deadline(self) -> float | None:
        timeout = call_timeout(self.provider_name)
        return None if timeout is None else time.monotonic() + timeout

    # -- running --------------------------------------------------------------------------------
    def run(self, inputs: list[Parts], single: bool) -> Embeddings:
        """Embed ``inputs`` batch by batch; the first error left after the retries is raised
        (its attempts' usage rows are written)."""
        return self._result([self._batch(part, single) for part in self._batches(inputs)])

    def _batches(self, inputs: Sequence[Parts]) -> list[list[Parts]]:
        return batches(inputs, self.wire.max_batch)

    def _batch(self, inputs: list[Parts], single: bool) -> tuple[Parsed, UsageRecord]:
        for attempt in range(agentloop_settings.MODEL_RETRIES + 1):
            for wait in self._waits(inputs):
                time.sleep(wait)
            started = time.monotonic()
            watch = watchdog.CallWatch(self._deadline(), None)
            try:
                with watchdog.watching(watch):
                    parsed = self.wire.call(inputs, self.dimensions, single)
            except ProviderError as exc:
                error = self._timed_out(exc, watch)
                self._write(self._usage(None, inputs, error, started))
                delay = retry_delay(attempt, error)
                if delay is None or attempt == agentloop_settings.MODEL_RETRIES:
                    if error is exc:
                        raise
                    raise error from exc
                time.sleep(delay)
                continue
            usage = self._usage(parsed, inputs, None, started)
            self._write(usage)
            return parsed, usage
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    def _timed_out(self, error: ProviderError, watch: watchdog.CallWatch) -> ProviderError:
        """The error an attempt aborted by the call deadline reports: a timeout."""
        if watch.reason == "deadline" and not isinstance(error, ProviderTimeout):
            return ProviderTimeout(f"{self.label} did not answer within the call deadline")
        return error

    def _write(self, usage: UsageRecord) -> None:
        if self.record is not None:
            self.record(usage)

    async def arun(self, inputs: list[Parts], single: bool) -> Embeddings:
        """:meth:`run` for ``aembed``: requests over ``httpx.AsyncClient``; the rate limits'
        buckets and the usage rows (database or Redis statements) on the ORM's thread."""
        return self._result([await self._abatch(part, single) for part in self._batches(inputs)])

    async def _abatch(self, inputs: list[Parts], single: bool) -> tuple[Parsed, UsageRecord]:
        for attempt in range(agentloop_settings.MODEL_RETRIES + 1):
            waits = self._waits(inputs)
            while (wait := await _on_the_orm_thread(next, waits, None)) is not None:
                await asyncio.sleep(wait)
            started = time.monotonic()
            timeout = call_timeout(self.provider_name)
            try:
                try:
                    async with asyncio.timeout(timeout):
                        parsed = await self.wire.acall(inputs, self.dimensions, single)
                except TimeoutError as exc:
                    raise ProviderTimeout(
                        f"{self.label} did not answer within the call deadline"
                    ) from exc
            except ProviderError as exc:
                await _on_the_orm_thread(self._write, self._usage(None, inputs, exc, started))
                delay = retry_delay(attempt, exc)
                if delay is None or attempt == agentloop_settings.MODEL_RETRIES:
                    raise
                await asyncio.sleep(delay)
                continue
            usage = self._usage(parsed, inputs, None, started)
            await _on_the_orm_thread(self._write, usage)
            return parsed, usage
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover
