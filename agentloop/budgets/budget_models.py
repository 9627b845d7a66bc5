"""The budget tables' model classes, looked up in Django's app registry when used.

The budgets sit below the models package (the chat model's store reserves through them), so
they can't import it: importing ``agentloop.models.budgets`` runs ``agentloop.models``, whose
chat model imports the store. The registry is ready by the time a model call is made.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps


def budget_model() -> Any:
    """``agentloop.Budget``: one row per subject, its limits and running totals."""
    return apps.get_model("agentloop", "Budget")


def reservation_model() -> Any:
    """``agentloop.BudgetReservation``: one model call's estimate held against a subject."""
    return apps.get_model("agentloop", "BudgetReservation")


def slot_model() -> Any:
    """``agentloop.BudgetSlot``: a chat's place among a subject's chats in flight."""
    return apps.get_model("agentloop", "BudgetSlot")
