"""Amounts in budgets: whole units of 1e-8 US dollars in the counters (the precision of
``Usage.cost``; integers add up exactly on every database), dollars everywhere else."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

__all__ = ["UNIT", "dollars", "shown", "units"]

#: one unit of the counters, in US dollars.
UNIT = Decimal("0.00000001")


def units(amount: Decimal | None) -> int:
    """``amount`` dollars in units (a part of a unit counts as one); None (no price): 0."""
    if amount is None:
        return 0
    return int((Decimal(amount) / UNIT).to_integral_value(rounding=ROUND_CEILING))


def dollars(count: int) -> Decimal:
    """``count`` units in dollars."""
    return (Decimal(count) * UNIT).quantize(UNIT)


def shown(amount: Decimal) -> str:
    """An amount as a budget's reason shows it: "$20.00", "$1,500.00", "$0.005"."""
    cents = amount.quantize(Decimal("0.01"))
    if cents == amount:
        return f"${cents:,.2f}"
    return f"${amount.normalize():,f}"
