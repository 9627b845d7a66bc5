"""Cancellation checkpoints: where a run looks at the cancel flag, and how often."""

from __future__ import annotations

import time

from ..exceptions import CancelledError
from .store import ChatStore

__all__ = ["Checkpoints"]


#: how often a throttled checkpoint reads the flag while the store's notices cover the run
#: (``store.stopping.notices_cover``): only a backstop then, for a notice lost in a way the
#: subscription didn't notice.
COVERED_INTERVAL = 5.0


class Checkpoints:
    """Reads the store's cancel flag; throttled reads cost nothing between polls.

    Forced checks (start of a verb, around each tool) always read. Throttled ones
    (before the model request, between streamed chunks) read at most once per
    ``interval`` seconds, so a fast stream does not cost a query per chunk; while the
    store's notices cover the run (a worker's Redis subscription), at most once per
    ``COVERED_INTERVAL``: a cancel sets the notice, and the next checkpoint reads at once.
    """

    def __init__(self, store: ChatStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._last_read = float("-inf")

    def observe(self, requested_at: object) -> None:
        """A flag value read by someone else just now (with the transcript): count it as
        this checkpoint's read."""
        self._last_read = time.monotonic()
        if requested_at is not None:
            raise CancelledError("The run was cancelled.", requested_at=requested_at)

    def due(self) -> bool:
        """A throttled check would read the flag now (an async stream then reads it on the
        database's thread; otherwise the check costs nothing and is skipped)."""
        notice = self.store.cancel_notice
        # A notice (same process, or a Redis message) makes the next check read at once.
        if notice is not None and notice.is_set():
            return True
        elapsed = time.monotonic() - self._last_read
        if elapsed < self.interval:
            return False
        return elapsed >= COVERED_INTERVAL or not self.store.stopping.notices_cover(self._last_read)

    def check(self, *, force: bool = True) -> None:
        """Raise :class:`CancelledError` if cancellation was requested."""
        if not force and not self.due():
            return
        notice = self.store.cancel_notice
        noticed = notice is not None and notice.is_set()
        self._last_read = time.monotonic()
        requested_at = self.store.stopping.cancel_requested_at()
        if noticed and notice is not None:
            notice.clear()  # after the read, which saw the flag the notice announced
        if requested_at is not None:
            raise CancelledError("The run was cancelled.", requested_at=requested_at)
