"""Well-known models: provider, context window and prices (``models.json``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from importlib import resources

from ..messages import TokenUsage

__all__ = ["ModelInfo", "lookup", "price_of"]

_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class ModelInfo:
    """What we know about a model id. Prices are per million tokens, in US dollars."""

    id: str
    provider: str
    context_window: int | None
    input_price: Decimal | None
    output_price: Decimal | None
    cached_input_price: Decimal | None


def _decimal(value: object) -> Decimal | None:
    return None if value is None else Decimal(str(value))


@lru_cache(maxsize=1)
def _catalog() -> dict[str, ModelInfo]:
    raw = json.loads(resources.files(__package__).joinpath("models.json").read_text("utf-8"))
    models = {}
    for entry in raw["models"]:
        info = ModelInfo(
            id=entry["id"],
            provider=entry["provider"],
            context_window=entry.get("context_window"),
            input_price=_decimal(entry.get("input_price")),
            output_price=_decimal(entry.get("output_price")),
            cached_input_price=_decimal(entry.get("cached_input_price")),
        )
        models[info.id] = info
        for alias in entry.get("aliases", ()):
            models[alias] = info
    return models


# A snapshot's suffix: "-2025-04-14" (OpenAI), "-20251001" (Anthropic), "-001" (Gemini).
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3})$")


def lookup(model: str) -> ModelInfo | None:
    """The catalog entry for ``model``; a dated snapshot falls back to its base id.

    Only a snapshot suffix is dropped: a variant such as ``o3-pro`` or ``gpt-4o-audio-preview``
    is priced differently from its family and stays unknown unless it has an entry.
    """
    catalog = _catalog()
    if model in catalog:
        return catalog[model]
    base = _SNAPSHOT.sub("", model)
    return catalog.get(base) if base != model else None


def price_of(model: str, usage: TokenUsage, provider: str | None = None) -> Decimal | None:
    """The cost of ``usage`` on ``model``; None when the price isn't known."""
    info = lookup(model)
    if info is None or info.input_price is None or info.output_price is None:
        return None
    cached = min(usage.cached_tokens, usage.input_tokens)
    cached_price = (
        info.cached_input_price if info.cached_input_price is not None else info.input_price
    )
    total = (
        Decimal(usage.input_tokens - cached) * info.input_price
        + Decimal(cached) * cached_price
        + Decimal(usage.output_tokens) * info.output_price
    ) / _MILLION
    return total.quantize(Decimal("0.00000001"))
