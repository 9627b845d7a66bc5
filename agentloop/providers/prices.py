"""Where a model's price comes from, besides the catalog's hand-kept list (``models.json``).

- ``AGENTLOOP["PRICES"]``: an operator's prices per million tokens, by "provider:model"
  (the provider's name as configured, or its kind: "vertexai", "azure", "bedrock"). They
  win over every other source: a cloud's price differs by region, deployment and contract.
- genai-prices (Pydantic's maintained price data, the ``prices`` extra), when it is
  installed: it prices what the catalog doesn't, the clouds' models included (Vertex AI's,
  Bedrock's). Imported on first use; only the entries of the provider the call went through
  are taken, never another vendor's list price for a model a cloud serves (genai-prices
  itself falls back to those for some, Azure's OpenAI models among them).

:func:`agentloop.providers.catalog.price_of` asks them in that order around the catalog.
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal
from functools import lru_cache
from typing import Any

from ..conf import ModelPrice, agentloop_settings
from ..messages import TokenUsage

__all__ = ["GENAI_PROVIDERS", "configured_price", "genai_price", "genai_prices_installed"]

logger = logging.getLogger(__name__)

#: genai-prices' provider for each built-in provider (by its kind: the class's name).
GENAI_PROVIDERS = {
    "openai": "openai",
    "openai-responses": "openai",
    "openrouter": "openrouter",
    "deepseek": "deepseek",
    "anthropic": "anthropic",
    "gemini": "google",
    "vertexai": "google",
    "azure": "azure",
    "bedrock": "aws",
}

# A snapshot's suffix: "-2025-04-14" (OpenAI), "-20251001" (Anthropic), "-001" (Gemini).
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3})$")


def configured_price(model: str, provider: str | None, configured: str | None) -> ModelPrice | None:
    """The ``AGENTLOOP["PRICES"]`` entry for ``model`` through the provider configured as
    ``configured`` (else of kind ``provider``); a dated snapshot takes its base id's."""
    prices = agentloop_settings.PRICES
    if not prices:
        return None
    names = [name for name in (configured, provider) if name]
    for candidate in dict.fromkeys((model, _SNAPSHOT.sub("", model))):
        for name in names:
            found = prices.get(f"{name}:{candidate}")
            if found is not None:
                return found
    return None


#: (model, genai-prices provider) pairs it has no price of. genai-prices remembers the
#: models it found but not the misses, and looks for one through every entry of the
#: provider on each call: a fine-tune or a local model's id would cost that scan twice a
#: step (the estimate and the usage row). Its data is the installed package's, so a miss
#: stays a miss for the process's life; the bound only keeps a stream of odd ids small.
_unpriced: dict[tuple[str, str], None] = {}
_UNPRICED_KEPT = 1024


def _remember_unpriced(model: str, wanted: str) -> None:
    if len(_unpriced) >= _UNPRICED_KEPT:
        _unpriced.clear()
    _unpriced[(model, wanted)] = None


@lru_cache(maxsize=1)
def _genai() -> Any:
    """The genai-prices module, or None when it is not installed."""
    try:
        # Function-local: genai-prices is an optional dependency (the "prices" extra).
        import genai_prices
    except ImportError:
        return None
    return genai_prices


def genai_prices_installed() -> bool:
    """genai-prices can be imported here."""
    return _genai() is not None


def genai_price(model: str, usage: TokenUsage, provider: str | None) -> Decimal | None:
    """The cost of ``usage`` on ``model`` through a provider of kind ``provider`` by
    genai-prices' data; None when it isn't installed, doesn't know the provider or the
    model, or would price it as another provider's."""
    genai = _genai()
    wanted = GENAI_PROVIDERS.get(provider or "")
    if genai is None or wanted is None or (model, wanted) in _unpriced:
        return None
    counts = genai.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
    )
    try:
        found = genai.calc_price(counts, model, provider_id=wanted)
    except LookupError:
        _remember_unpriced(model, wanted)  # a model it doesn't price
        return None
    except Exception:
        # Prices are an estimate's input, never a reason to fail a model call.
        logger.warning("genai-prices could not price %s:%s", provider, model, exc_info=True)
        return None
    # Only the provider's own entries: genai-prices falls back to other vendors' models for
    # some (Azure to OpenAI's, xAI's...), and a cloud's call is never priced at another
    # vendor's list price (see the catalog's "clouds").
    own = found.provider.id == wanted and any(m is found.model for m in found.provider.models)
    if not own:
        _remember_unpriced(model, wanted)
        return None
    return Decimal(found.total_price).quantize(Decimal("0.00000001"))
