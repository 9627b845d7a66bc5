"""A persisted chat's budgets, as its store holds them (``store.budgets``, the Django store's
``Budgets`` part, and the writes of its usage rows): its subjects, worked out once per store;
the reservation before each model call; the charge in each usage row's transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..conf import agentloop_settings
from ..engine import UsageRecord
from ..engine.rate_limiting import CallEstimate
from ..engine.store import Budgets
from ..exceptions import BudgetExceededError
from . import counters, slots, statements
from .limits import budgets_on, units
from .subjects import Subject, subjects_of

__all__ = ["ChatBudgets"]


class ChatBudgets(Budgets):
    """The budgets one chat's model calls count against."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        self._subjects: list[Subject] | None = None
        #: the subjects whose chats-in-flight quota this chat holds a place of (or waits for
        #: one), as this process's reservations found; freed when its run ends.
        self.places: set[str] = set()
        #: the last reservation found no place: the chat waits in line (background).
        self.in_line = False

    @property
    def using(self) -> str:
        return self.chat._state.db or "default"

    def subjects(self) -> list[Subject]:
        """The chat's subjects (``BUDGET_SUBJECT``), asked for once."""
        if self._subjects is None:
            self._subjects = subjects_of(self.chat)
        return self._subjects

    def reserve(self, estimate: CallEstimate, *, wait: bool = False) -> counters.Reservation | None:
        """Reserve ``estimate`` (``BudgetExceededError`` when a subject has no room); None
        when budgets are off or no subject counts the chat. ``wait`` (a background step): a
        chat that finds no place of a chats-in-flight quota queues for one."""
        self.in_line = False
        if not budgets_on() or self.chat.pk is None:
            return None
        subjects = self.subjects()
        if not subjects:
            return None
        if (
            len(subjects) == 1
            and statements.one_statement(self.using)
            and getattr(agentloop_settings.BUDGETS, "chats_in_flight", None) is None
        ):
            # The common case in one round trip; the transaction form decides the others.
            quick = statements.reserve_at_once(subjects[0], estimate, self.chat, self.using)
            if quick is not None:
                return quick
        try:
            reservation = counters.reserve(subjects, estimate, self.chat, self.using, wait=wait)
        except BudgetExceededError as exc:
            if exc.limit == "chats_in_flight":
                self.places.update(subject.key for subject in subjects)
                self.in_line = wait
            raise
        self.places.update(reservation.places)
        return reservation

    def released(self, state: str) -> list[tuple[str, str]]:
        """After the chat's release as ``state``: the chats in line whose turn came (their
        jobs are to be sent), as (chat model label, chat key). A run that ended frees its
        places; a chat that just queued for one looks whether a place freed meanwhile."""
        if not self.places:
            return []
        subjects = sorted(self.places)
        if state not in ("queued", "running"):
            slots.leave(subjects, self.chat, self.using)
            self.places.clear()
        elif not self.in_line:
            return []  # it goes on holding its places
        return slots.due(subjects, self.using)

    def charges(self, usage: UsageRecord) -> bool:
        """Writing ``usage`` charges a budget (its reservation, or a subject counting it)."""
        if usage.reservation is not None:
            return True
        return budgets_on() and bool(self.subjects())

    def charge(self, usage: UsageRecord) -> None:
        """Charge ``usage``'s exact cost and tokens and settle its reservation; in the
        transaction that writes its row."""
        if not self.charges(usage):
            return
        reservation = usage.reservation
        subjects = self.subjects() if budgets_on() else []
        if reservation is not None:
            # The subjects the call reserved against: a hook answering otherwise meanwhile
            # must not leave one of their reservations held.
            known = {subject.key: subject for subject in subjects}
            subjects = [known.get(key, Subject(key)) for key in reservation.subjects]
        tokens = usage.usage.input_tokens + usage.usage.output_tokens
        counters.charge(subjects, units(usage.cost), tokens, reservation, self.using)

    def charge_at_once(self, usage: UsageRecord) -> Callable[[Any], list[str]] | None:
        """The charge of ``usage`` as parts of the step's one-statement write (PostgreSQL):
        for an attempt with a reservation, whose rows are known to exist; None otherwise
        (nothing to charge, or the transaction form must: ``charge``)."""
        reservation = usage.reservation
        if reservation is None or not reservation.rows:
            return None
        tokens = usage.usage.input_tokens + usage.usage.output_tokens
        cost = units(usage.cost)

        def parts(values: Any) -> list[str]:
            return statements.charge_parts(values.add, reservation, cost, tokens, self.using)

        return parts
