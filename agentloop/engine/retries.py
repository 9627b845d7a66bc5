"""The one backoff policy: how long to wait before trying a failed model call again.

Used twice with the same rules: between the retries of one model call inside a step
(``MODEL_RETRIES``), and by background jobs between attempts of a step (``STEP_RETRIES``).
"""

from __future__ import annotations

import random

from ..conf import agentloop_settings
from ..exceptions import ProviderError

__all__ = ["backoff", "retry_delay"]


def backoff(
    attempt: int,
    retry_after: float | None = None,
    *,
    cap: float | None = None,
    outage: bool = False,
) -> float:
    """Seconds to wait before retry number ``attempt + 1``.

    The provider's ``Retry-After`` wins, up to ``RETRY_AFTER_MAX``; otherwise exponential
    from ``RETRY_BACKOFF`` with full jitter (spreads many workers hitting the same limit),
    up to ``cap`` (default ``RETRY_BACKOFF_MAX``). ``outage`` (the database can't be
    reached): at least half the exponential wait, so a few tries span an outage of seconds
    (full jitter alone can spend them all within one).
    """
    if retry_after is not None:
        return max(0.0, min(float(retry_after), agentloop_settings.RETRY_AFTER_MAX))
    limit = agentloop_settings.RETRY_BACKOFF_MAX if cap is None else cap
    base = agentloop_settings.RETRY_BACKOFF * (2**attempt)
    return min(random.uniform(base / 2 if outage else 0, base), limit)  # noqa: S311


def retry_delay(attempt: int, error: BaseException) -> float | None:
    """Within a step: the wait before retrying ``error`` (None when it is not transient).

    Capped at ``RETRY_BACKOFF_MAX`` so one step never sleeps long; between background jobs
    :func:`backoff` honours ``Retry-After`` up to ``RETRY_AFTER_MAX`` instead.
    """
    if not isinstance(error, ProviderError) or not error.retryable:
        return None
    return min(backoff(attempt, error.retry_after), agentloop_settings.RETRY_BACKOFF_MAX)
