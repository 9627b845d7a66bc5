"""One writer per chat: a lease (token + expiry) on the chat row.

Taking, renewing and releasing are each one conditional UPDATE, so two workers
can never both believe they hold a chat. While a lease is held, every write
transaction of the Django store starts by renewing it (:meth:`Lease.ensure`):
a worker whose lease expired and was taken over fails that UPDATE and writes
nothing (``LeaseLostError``). On PostgreSQL the renewal's row lock also makes a
would-be taker wait until the writer's transaction ends.
"""

from __future__ import annotations

import logging
import secrets
import threading
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connections
from django.db.models import Q
from django.utils import timezone

from .conf import agentloop_settings
from .exceptions import LeaseLostError

__all__ = ["Heartbeat", "Lease"]

logger = logging.getLogger(__name__)


class Lease:
    """A held lease on one chat row."""

    def __init__(self, chat_model: Any, chat_pk: Any, token: str, seconds: float) -> None:
        self.chat_model = chat_model
        self.chat_pk = chat_pk
        self.token = token
        self.seconds = seconds

    def __repr__(self) -> str:
        return f"<Lease chat={self.chat_pk} token={self.token[:6]}…>"

    @classmethod
    def take(cls, chat_model: Any, chat_pk: Any, seconds: float | None = None) -> Lease | None:
        """The lease if the chat is free (no lease, or an expired one), else None."""
        seconds = float(seconds or agentloop_settings.LEASE_SECONDS)
        token = secrets.token_hex(16)
        now = timezone.now()
        taken = (
            chat_model.objects.filter(pk=chat_pk)
            .filter(Q(lease_token="") | Q(lease_expires_at__lt=now))
            .update(
                lease_token=token,
                lease_expires_at=now + timedelta(seconds=seconds),
                state="running",
                updated_at=now,
            )
        )
        return cls(chat_model, chat_pk, token, seconds) if taken else None

    def renew(self) -> bool:
        """Push the expiry out; False if the lease is no longer ours."""
        return bool(
            self.chat_model.objects.filter(pk=self.chat_pk, lease_token=self.token).update(
                lease_expires_at=timezone.now() + timedelta(seconds=self.seconds)
            )
        )

    def ensure(self) -> None:
        """Renew, or raise :class:`LeaseLostError` (call first in a write transaction)."""
        if not self.renew():
            raise LeaseLostError(
                f"The lease on chat {self.chat_pk} expired and was taken over; "
                "this worker stops without writing."
            )

    def release(self, **fields: Any) -> bool:
        """Give the chat up, setting ``fields`` (e.g. state) in the same UPDATE."""
        return bool(
            self.chat_model.objects.filter(pk=self.chat_pk, lease_token=self.token).update(
                lease_token="", lease_expires_at=None, updated_at=timezone.now(), **fields
            )
        )


class Heartbeat:
    """Renews a lease from a background thread while a long model call or tool runs."""

    def __init__(self, lease: Lease, interval: float | None = None) -> None:
        self.lease = lease
        self.interval = interval if interval is not None else max(lease.seconds / 3, 0.5)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"agentloop-lease-{lease.chat_pk}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                close_old_connections()
                if not self.lease.renew():
                    self.lost.set()
                    logger.warning("Lost the lease on chat %s", self.lease.chat_pk)
                    return
        except Exception:  # a heartbeat must never take the worker down
            logger.exception("Lease heartbeat for chat %s failed", self.lease.chat_pk)
        finally:
            connections.close_all()
