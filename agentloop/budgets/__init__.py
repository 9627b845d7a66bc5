"""Budgets and quotas per subject (docs/budgets.md): cost and tokens per day and month, and
chats in flight at once, for each owner (or each team, tenant... that
``AGENTLOOP["BUDGET_SUBJECT"]`` chooses), enforced before every model call by conditional
statements on the subject's ``Budget`` row, so two processes never both spend its last cent.

- :mod:`.subjects`: whom a chat's spend counts against (:class:`Subject`);
- :mod:`.limits`: a subject's limits (its row's, else the settings') and the stop reasons;
- :mod:`.counters`: reserving a call's estimate, charging its exact cost, expiry;
- :mod:`.slots`: the chats-in-flight quota;
- :mod:`.enforcement`: a chat's budgets as its store holds them;
- :mod:`.spend`: what a subject spent against its limits (the admin, your own pages).
"""

from __future__ import annotations

from .counters import release_expired
from .limits import Limits, limits_of
from .spend import Spend, spend_of
from .subjects import Subject, owner_subject, subjects_of

__all__ = [
    "Limits",
    "Spend",
    "Subject",
    "limits_of",
    "owner_subject",
    "release_expired",
    "spend_of",
    "subjects_of",
]
