"""How many model calls a process has in flight at once, per provider or model.

``AGENTLOOP["MODEL_CONCURRENCY"]`` sets the limits: ``{"openai": 50, "anthropic:claude-opus-4":
10, "default": 100}``. A call takes a slot of its model's limit when there is one, then of its
provider's (or, for a provider without one, a slot of a ``"default"``-sized limit of that
provider's own); with no limit it takes none. A call that finds no slot free waits in line
(first come, first served, whether it waits in a thread, a greenlet or a coroutine): waiting
is not a failure. The driver waits in short slices, so a cancel stops a waiting call and the
wait counts against the call's deadline (:mod:`agentloop.engine._drivers`).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

from ..conf import agentloop_settings

__all__ = ["Slots", "Ticket", "slots_for"]


class Ticket:
    """A place in line for a slot; ``granted`` once it holds one."""

    __slots__ = ("granted", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.granted = False
        #: called (from the thread that freed the slot) when the slot is handed over.
        self.wake = wake


class Slots:
    """A limit of ``size`` calls at once; a freed slot goes to the first in line."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.taken = 0
        self._line: deque[Ticket] = deque()
        self._lock = threading.Lock()

    def request(self, wake: Callable[[], None]) -> Ticket:
        """A ticket: granted at once when a slot is free and no one waits, else in line
        (``wake`` is called when it is granted)."""
        ticket = Ticket(wake)
        with self._lock:
            if self.taken < self.size and not self._line:
                self.taken += 1
                ticket.granted = True
            else:
                self._line.append(ticket)
        return ticket

    def give_back(self, ticket: Ticket) -> None:
        """Free the ticket's slot, or leave the line (a cancelled or timed-out wait)."""
        with self._lock:
            if not ticket.granted:
                self._line.remove(ticket)
                return
            ticket.granted = False
            if not self._line:
                self.taken -= 1
                return
            following = self._line.popleft()
            following.granted = True  # the slot passes on: ``taken`` stays
        following.wake()

    @property
    def waiting(self) -> int:
        """Calls in line now."""
        return len(self._line)


_pools: dict[tuple[str, int], Slots] = {}
_lock = threading.Lock()


def slots_for(provider: str, model: str) -> list[Slots]:
    """The limits a call of ``provider:model`` takes a slot of, in the order to take them."""
    limits = agentloop_settings.MODEL_CONCURRENCY
    if not limits:
        return []
    model_key = f"{provider}:{model}"
    sizes = [
        (model_key, limits.get(model_key)),
        (provider, limits[provider] if provider in limits else limits.get("default")),
    ]
    found = [(key, size) for key, size in sizes if size]
    with _lock:
        # Keyed by size too: a changed setting makes a new limit; calls in the old one finish.
        return [_pools.setdefault((key, size), Slots(key, size)) for key, size in found]


def _forget_after_fork() -> None:
    """A forked child counts its own calls."""
    global _lock
    _lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
