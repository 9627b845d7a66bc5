"""Before each model call: the fleet's rate limits, then the chat's budgets.

A call is estimated first (:mod:`.estimates`). Then it takes from the rate-limit buckets of
its provider and model (:mod:`.rate_limiting`), waiting in place in short slices, each
looking at the run's cancel; a background step that would wait longer than
``RATE_LIMIT_WAIT`` ends instead (``RateLimitWaiting``: its job is sent again when the
limit has room). Last, the store reserves the estimate against the budgets of the chat's
subjects (``store.budgets.reserve``); a budget with no room stops the turn
(``BudgetExceededError``, the chat ``stopped`` with the reason), except a background step's
chat finding every place of a chats-in-flight quota taken: it waits in line
(``PlaceWaiting``: the chat stays queued, and its job is sent when a place frees). The usage
row of the attempt settles the reservation to the exact cost.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import BudgetExceededError, PlaceWaiting, ProviderTimeout, RateLimitWaiting
from ..messages import ModelRequest
from ..providers.base import Provider
from .checkpoints import Checkpoints
from .effects import Effects, Sleep
from .estimates import CallEstimate, estimate_call
from .rate_limiting import buckets_for
from .sending import call_timeout
from .store import ChatStore

__all__ = ["Admission"]

#: longest sleep between two looks at the cancel while waiting for a rate limit (seconds).
SLICE = 0.25
#: a wait at least this long is written on the chat (``waiting_for``) while it lasts.
SHOWN_AFTER = 1.0


class Admission:
    """Lets one chat's model calls go: paced by the rate limits, within the budgets."""

    def __init__(self, store: ChatStore, emit: Callable[..., None]) -> None:
        self.store = store
        self._emit = emit

    def admit(
        self,
        provider: Provider,
        provider_name: str,
        request: ModelRequest,
        checkpoints: Checkpoints | None,
    ) -> Effects[Any]:
        """Wait for the rate limits, then reserve the budget; the reservation (for the
        attempt's usage row), or None when no budget counts the chat."""
        estimate = estimate_call(provider, provider_name, request)
        yield from self._pace(estimate, checkpoints)
        try:
            budgets = self.store.budgets
            # A background step's chat queues for a chats-in-flight place; a verb in-process
            # can't wait in line (its caller waits for it): it stops.
            return budgets.reserve(estimate, wait=self.store.runs.background) if budgets else None
        except BudgetExceededError as exc:
            if exc.limit == "chats_in_flight" and self.store.runs.background:
                raise PlaceWaiting(exc.reason) from exc  # not a stop: it queued for a place
            self.store.stopping.record_stop(exc.reason)
            self._emit("budget_exceeded", exc)
            self._emit("stopped", exc.reason)
            raise

    def _pace(self, estimate: CallEstimate, checkpoints: Checkpoints | None) -> Effects[None]:
        limiter = self.store.rate_limiter()
        buckets = buckets_for(estimate.provider, estimate.model, estimate.tokens)
        if limiter is None or not buckets:
            return
        timeout = call_timeout(estimate.provider)
        started = time.monotonic()
        shown = False
        while (short := limiter.take(buckets)) is not None:
            reason = f"rate limit: {short.bucket.label}"
            waited = time.monotonic() - started
            in_place = agentloop_settings.RATE_LIMIT_WAIT
            if self.store.runs.background and waited + short.seconds > in_place:
                # Not in a worker's slot: the job comes back when the bucket has room (a
                # little later for some, so the chats that waited don't all come at once).
                spread = random.uniform(0, min(1.0, short.seconds / 10))  # noqa: S311
                raise RateLimitWaiting(short.seconds + spread, reason)
            if timeout is not None and waited + short.seconds > timeout:
                raise ProviderTimeout(
                    f"{estimate.provider}: waited for the {reason} longer than the call's "
                    f"{timeout:g} s deadline (MODEL_CALL_TIMEOUT)"
                )
            if not shown and short.seconds >= SHOWN_AFTER:
                self.store.runs.note_waiting(reason)
                shown = True
            until = time.monotonic() + short.seconds
            while (left := until - time.monotonic()) > 0:
                yield Sleep(min(left, SLICE))
                if checkpoints is not None:
                    checkpoints.check(force=False)  # a cancel stops a waiting call
        if shown:
            self.store.runs.note_waiting("")  # a failure's release clears it too
