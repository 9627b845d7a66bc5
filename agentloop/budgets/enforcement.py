"""A persisted chat's budgets, as its store holds them (``DjangoStore.reserve`` and the writes
of its usage rows): its subjects, worked out once per store; the reservation before each
model call; the charge in each usage row's transaction."""

from __future__ import annotations

from typing import Any

from ..engine import UsageRecord
from ..engine.estimates import CallEstimate
from . import counters
from .limits import budgets_on
from .money import units
from .subjects import Subject, subjects_of

__all__ = ["ChatBudgets"]


class ChatBudgets:
    """The budgets one chat's model calls count against."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        self._subjects: list[Subject] | None = None

    @property
    def using(self) -> str:
        return self.chat._state.db or "default"

    def subjects(self) -> list[Subject]:
        """The chat's subjects (``BUDGET_SUBJECT``), asked for once."""
        if self._subjects is None:
            self._subjects = subjects_of(self.chat)
        return self._subjects

    def reserve(self, estimate: CallEstimate) -> counters.Reservation | None:
        """Reserve ``estimate`` (``BudgetExceededError`` when a subject has no room); None
        when budgets are off or no subject counts the chat."""
        if not budgets_on() or self.chat.pk is None:
            return None
        subjects = self.subjects()
        if not subjects:
            return None
        return counters.reserve(subjects, estimate, self.chat, self.using)

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
