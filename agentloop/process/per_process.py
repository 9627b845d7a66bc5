"""One object per process, made on first use: a forked child (a prefork pool process) makes
its own instead of sharing its parent's threads and sockets."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """Holds this process's ``make()``: :meth:`get` makes it once, :meth:`peek` doesn't."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> T:
        """This process's object, made now if it has none."""
        value = self._value
        if value is not None:  # every step asks: no lock once it is made
            return value
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value

    def peek(self) -> T | None:
        """This process's object if it was made, else None."""
        return self._value

    def _forget(self) -> None:
        # The child's copies of the parent's threads don't run, and its lock may be held.
        self._value = None
        self._lock = threading.Lock()
