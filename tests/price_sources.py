"""Where prices come from, for the tests of prices: ``without_genai_prices``, a fixture
making genai-prices (the ``prices`` extra) unimportable for one test, as it is where the
extra isn't installed: the catalog (and ``AGENTLOOP["PRICES"]``) alone price the calls."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from agentloop.providers import prices


@pytest.fixture
def without_genai_prices(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """genai-prices not installed: its import fails (None in ``sys.modules``)."""
    monkeypatch.setitem(sys.modules, "genai_prices", None)
    prices._genai.cache_clear()
    yield
    prices._genai.cache_clear()
