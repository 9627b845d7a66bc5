"""Deprecated: the runners moved to :mod:`agentloop.runners` (this alias goes in 0.3).

``agentloop.background.wait_for_embedded_jobs`` and ``enqueue`` still work and warn once;
``backend_name`` is ``agentloop.runners.runner_name``.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import runners

_MOVED = {
    "backend_name": "runner_name",
    "enqueue": "enqueue",
    "mark_unsent": "mark_unsent",
    "wait_for_embedded_jobs": "wait_for_embedded_jobs",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"agentloop.background.{name} moved to agentloop.runners.{_MOVED[name]}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(runners, _MOVED[name])
