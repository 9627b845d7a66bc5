"""One Redis reader per event loop for the async live streams of a process.

An open stream under ASGI waits for its chat's events without a thread. Waiting with a
blocking ``XREAD`` of its own would hold a Redis connection per stream (a user with a hundred
tabs: a hundred connections). Instead each event loop has one :class:`StreamHub`: a task
that reads every followed stream in one ``XREAD BLOCK`` on one connection and hands each
:class:`Subscription` the events after its position. The hub starts with its first
subscription and closes its connection when the last one leaves.

A stream joining while the hub waits is read from the hub's next ``XREAD``, at most
:data:`BLOCK` seconds later. A subscription holds at most ``count`` events it has not taken
(a reader that stops reading is left out of the reads until it takes them).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

__all__ = ["BLOCK", "StreamHub", "Subscription", "subscribe"]

logger = logging.getLogger(__name__)

#: the longest one shared XREAD waits (seconds): how late a stream that joins is first read.
BLOCK = 0.1

#: the hubs of each running event loop, by Redis URL.
_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, StreamHub]] = (
    weakref.WeakKeyDictionary()
)


def _position(event_id: str | bytes) -> tuple[int, int]:
    """A stream id as numbers, for comparing ("5" is "5-0")."""
    text = event_id.decode() if isinstance(event_id, bytes) else event_id
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds or 0), int(sequence or 0)


class Subscription:
    """One stream's reads through its event loop's hub (:meth:`read`); :meth:`aclose` when
    done. Bound to a Redis stream by its first read."""

    def __init__(self, hub: StreamHub) -> None:
        self.hub = hub
        self.stream: str | None = None
        #: the id of the latest event handed over (the reader's position).
        self.position = "0-0"
        self.events: list[tuple[bytes, dict[bytes, bytes]]] = []
        #: the stream is an erased chat's tombstone: nothing to read, ever.
        self.erased = False
        self.error: BaseException | None = None
        self.ready = asyncio.Event()

    async def read(
        self, stream: str, after: str | None, timeout: float
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """The entries of ``stream`` after ``after`` (this subscription's position once
        bound), waiting up to ``timeout`` seconds for some; raises what the hub's read raised."""
        if stream != self.stream:
            self.stream, self.position = stream, after or "0-0"
            self.events, self.erased = [], False
            self.hub.wake()
        if not self.events and self.error is None and not self.erased:
            self.ready.clear()
            try:
                await asyncio.wait_for(self.ready.wait(), timeout)
            except TimeoutError:
                pass
        elif self.erased:
            await asyncio.sleep(timeout)  # as a read that found nothing
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        taken, self.events = self.events, []
        return taken

    async def aclose(self) -> None:
        """Leave the hub (its connection closes when no subscription is left)."""
        self.hub.leave(self)


class StreamHub:
    """The shared reader of one event loop and one Redis URL (see the module)."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop, count: int) -> None:
        import redis.asyncio  # the optional "redis" extra, as in redis_client

        self.url = url
        #: weakly: the registry's key must be able to go (its entry goes with it).
        self.loop = weakref.ref(loop)
        self.count = count
        self.client: Any = redis.asyncio.Redis.from_url(url)
        self.subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self.task: asyncio.Task[None] | None = None
        self.closed = False

    def join(self) -> Subscription:
        subscription = Subscription(self)
        self.subscriptions.add(subscription)
        return subscription

    def leave(self, subscription: Subscription) -> None:
        self.subscriptions.discard(subscription)

    def wake(self) -> None:
        """Make sure the reading task runs (a subscription was bound)."""
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def _wanted(self) -> dict[str, str]:
        """Each followed stream with the lowest position its subscriptions need."""
        wanted: dict[str, str] = {}
        for subscription in list(self.subscriptions):
            stream = subscription.stream
            if stream is None or subscription.erased or len(subscription.events) >= self.count:
                continue
            known = wanted.get(stream)
            if known is None or _position(subscription.position) < _position(known):
                wanted[stream] = subscription.position
        return wanted

    async def _run(self) -> None:
        task = asyncio.current_task()
        try:
            while self.subscriptions:
                if task is not None and task.cancelling():
                    # A cancel the client swallowed (a read's own timeout raced it and
                    # won, so the read just found nothing): stop, or the loop's shutdown
                    # waits for this task for ever.
                    raise asyncio.CancelledError
                wanted = self._wanted()
                if not wanted:
                    await asyncio.sleep(BLOCK)
                    continue
                try:
                    answer = await self.client.xread(
                        streams=wanted, count=self.count, block=max(1, int(BLOCK * 1000))
                    )
                except Exception as exc:
                    if task is not None and task.cancelling():
                        raise asyncio.CancelledError from exc  # as above, as an error
                    await self._failed(wanted, exc)
                    continue
                self._hand_over(answer)
        finally:
            # Off the registry first: a stream that joins from now on gets a new hub.
            self.closed = True
            loop = self.loop()
            hubs = _hubs.get(loop) if loop is not None else None
            if hubs is not None and hubs.get(self.url) is self:
                del hubs[self.url]
            try:
                await self.client.aclose()
            except Exception:  # the loop is closing, or Redis is away: nothing to keep
                logger.debug("Closing the live streams' Redis client failed", exc_info=True)

    def _hand_over(self, answer: Any) -> None:
        for name, entries in answer or []:
            stream = name.decode() if isinstance(name, bytes) else str(name)
            for subscription in list(self.subscriptions):
                if subscription.stream != stream:
                    continue
                after = _position(subscription.position)
                new = [entry for entry in entries if _position(entry[0]) > after]
                if new:
                    subscription.events += new
                    subscription.position = new[-1][0].decode()
                    subscription.ready.set()

    async def _failed(self, wanted: dict[str, str], exc: Exception) -> None:
        """One stream being a tombstone fails the whole XREAD: find which, and read without
        them; any other error goes to every reader (as their own XREAD would have)."""
        if "WRONGTYPE" in str(exc):
            pipeline = self.client.pipeline(transaction=False)
            for stream in wanted:
                pipeline.type(stream)
            try:
                kinds = await pipeline.execute()
            except Exception as again:
                exc = again
            else:
                erased = {
                    stream
                    for stream, kind in zip(wanted, kinds, strict=True)
                    if kind not in (b"stream", b"none")
                }
                for subscription in list(self.subscriptions):
                    if subscription.stream in erased:
                        subscription.erased = True
                        subscription.ready.set()
                return
        for subscription in list(self.subscriptions):
            if subscription.stream is not None:
                subscription.error = exc
                subscription.ready.set()
        await asyncio.sleep(BLOCK)


def subscribe(url: str, count: int) -> Subscription:
    """A subscription to the running event loop's hub for ``url`` (made on first use);
    ``count`` is the most entries one XREAD takes per stream."""
    loop = asyncio.get_running_loop()
    hubs = _hubs.setdefault(loop, {})
    hub = hubs.get(url)
    if hub is None or hub.closed:
        hub = hubs[url] = StreamHub(url, loop, count)
    return hub.join()
