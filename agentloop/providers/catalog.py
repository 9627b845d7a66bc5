"""Well-known models: provider, context window, whether they think, and prices
(``models.json``). It is the one place that knows which model takes which option
(:func:`accepts`; the providers ask through :mod:`~agentloop.providers.model_options`).

``models`` are the vendors' own APIs' entries, by model id. ``clouds`` are entries for a model
served through a cloud provider (Vertex AI, Azure AI Foundry), whose prices are the cloud's: a
call through that provider is priced by those entries only, never at another API's rates.
A price the catalog lacks may come from genai-prices, and ``AGENTLOOP["PRICES"]`` overrides
any (:mod:`.prices`; :func:`price_of`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import lru_cache
from importlib import resources
from typing import Any

from ..conf import ModelPrice
from ..messages import TokenUsage
from .prices import configured_price, genai_price

__all__ = ["ModelInfo", "accepts", "cloud_providers", "lookup", "price_of", "thinks"]

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
    #: a cache write kept 5 minutes (Anthropic: 1.25x input); None: priced as input.
    cache_write_price: Decimal | None = None
    #: a cache write kept an hour (Anthropic: 2x input); None: the 5-minute price.
    cache_write_1h_price: Decimal | None = None
    #: the model takes thinking options (reasoning effort, a thinking budget); None: unknown.
    thinking: bool | None = None
    #: the model takes a sampling temperature (OpenAI's reasoning models refuse one).
    temperature: bool = True


def _decimal(value: object) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _info(entry: dict[str, Any]) -> ModelInfo:
    return ModelInfo(
        id=entry["id"],
        provider=entry["provider"],
        context_window=entry.get("context_window"),
        input_price=_decimal(entry.get("input_price")),
        output_price=_decimal(entry.get("output_price")),
        cached_input_price=_decimal(entry.get("cached_input_price")),
        cache_write_price=_decimal(entry.get("cache_write_price")),
        cache_write_1h_price=_decimal(entry.get("cache_write_1h_price")),
        thinking=entry.get("thinking"),
        temperature=entry.get("temperature", True),
    )


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(
        resources.files(__package__).joinpath("models.json").read_text("utf-8")
    )
    return raw


@lru_cache(maxsize=1)
def _catalog() -> dict[str, ModelInfo]:
    models = {}
    for entry in _raw()["models"]:
        info = _info(entry)
        models[info.id] = info
        for alias in entry.get("aliases", ()):
            models[alias] = info
    return models


@lru_cache(maxsize=1)
def _clouds() -> dict[tuple[str, str], ModelInfo]:
    """The ``clouds`` entries by (provider, model id). Whether the model thinks or takes a
    temperature is the model's own: it is read from the vendor's entry, when there is one."""
    found = {}
    for entry in _raw().get("clouds", ()):
        info = _info(entry)
        vendor = _lookup_model(info.id)
        if vendor is not None:
            info = replace(info, thinking=vendor.thinking, temperature=vendor.temperature)
        found[(info.provider, info.id)] = info
    return found


@lru_cache(maxsize=1)
def cloud_providers() -> frozenset[str]:
    """The providers (BUILTINS names) the ``clouds`` list prices: a call through one is priced
    by its ``clouds`` entries only, never at the vendor API's rates."""
    return frozenset(provider for provider, _ in _clouds())


# A snapshot's suffix: "-2025-04-14" (OpenAI), "-20251001" (Anthropic), "-001" (Gemini).
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3})$")


def lookup(model: str, provider: str | None = None) -> ModelInfo | None:
    """The catalog entry for ``model``; a dated snapshot falls back to its base id.

    Only a snapshot suffix is dropped: a variant such as ``o3-pro`` or ``gpt-4o-audio-preview``
    is priced differently from its family and stays unknown unless it has an entry. A call
    through a cloud ``provider`` (one of :func:`cloud_providers`: ``vertexai``, ``azure``)
    takes that provider's ``clouds`` entry, or none: the cloud's prices are its own.
    """
    if provider is not None and provider in cloud_providers():
        clouds = _clouds()
        for candidate in (model, _SNAPSHOT.sub("", model)):
            if (provider, candidate) in clouds:
                return clouds[(provider, candidate)]
        return None
    return _lookup_model(model)


def _lookup_model(model: str) -> ModelInfo | None:
    """The ``models`` entry (a vendor's own API) for ``model`` or its snapshot's base id."""
    catalog = _catalog()
    if model in catalog:
        return catalog[model]
    base = _SNAPSHOT.sub("", model)
    return catalog.get(base) if base != model else None


#: the options :func:`accepts` knows, each a ModelInfo field.
OPTIONS = ("thinking", "temperature")


def accepts(model: str, option: str) -> bool | None:
    """Whether ``model`` takes ``option`` (one of :data:`OPTIONS`), as the catalog knows;
    None for a model it doesn't list (its provider's own rule, or the user, knows better)."""
    if option not in OPTIONS:
        raise ValueError(f"No catalog option {option!r}: one of {', '.join(OPTIONS)}")
    info = lookup(model)
    return None if info is None else getattr(info, option)


def thinks(model: str) -> bool | None:
    """Whether ``model`` takes thinking options (None: not in the catalog)."""
    return accepts(model, "thinking")


def price_of(
    model: str, usage: TokenUsage, provider: str | None = None, configured: str | None = None
) -> Decimal | None:
    """The cost of ``usage`` on ``model`` through a provider of kind ``provider``
    (configured under the name ``configured``); None when the price isn't known.

    Prices come from ``AGENTLOOP["PRICES"]`` first, then the catalog, then genai-prices when
    it is installed (:mod:`.prices`). ``input_tokens`` is the whole prompt: its cache reads
    are priced at the cached-input price, its cache writes at the write price of their
    lifetime (input price when none is given, as OpenAI bills them), the rest at the input
    price.
    """
    rates: ModelInfo | ModelPrice | None = configured_price(model, provider, configured)
    if rates is None:
        rates = lookup(model, provider)
        if rates is None or rates.input_price is None or rates.output_price is None:
            return genai_price(model, usage, provider)
    return _cost(rates, usage)


def _cost(rates: ModelInfo | ModelPrice, usage: TokenUsage) -> Decimal | None:
    """``usage`` at ``rates`` (per million tokens)."""
    input_price, output_price = rates.input_price, rates.output_price
    if input_price is None or output_price is None:
        return None
    # Counts a provider got wrong never make a negative share of plain input.
    read = min(usage.cache_read_tokens, usage.input_tokens)
    written = min(usage.cache_write_tokens, usage.input_tokens - read)
    written_1h = min(usage.cache_write_1h_tokens, written)
    read_price = rates.cached_input_price
    write_price = rates.cache_write_price
    write_1h_price = rates.cache_write_1h_price
    if read_price is None:
        read_price = input_price
    if write_price is None:
        write_price = input_price
    if write_1h_price is None:
        write_1h_price = write_price
    total = (
        Decimal(usage.input_tokens - read - written) * input_price
        + Decimal(read) * read_price
        + Decimal(written - written_1h) * write_price
        + Decimal(written_1h) * write_1h_price
        + Decimal(usage.output_tokens) * output_price
    ) / _MILLION
    return total.quantize(Decimal("0.00000001"))
