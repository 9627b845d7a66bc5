"""The model catalog (agentloop/providers/models.json): lookups, prices, and Usage.cost."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from importlib import resources

import pytest
from django.test import override_settings

from agentloop import providers
from agentloop.messages import TokenUsage
from agentloop.models import Chat, Usage
from agentloop.providers import catalog
from agentloop.providers.catalog import ModelInfo, accepts, lookup, price_of, thinks
from agentloop.providers.openai import OpenAIProvider
from tests.price_sources import without_genai_prices  # noqa: F401 (a fixture)
from tests.providers.wire import Recorder, chat_completion, serving

RAW = json.loads(resources.files("agentloop.providers").joinpath("models.json").read_text())
ENTRIES = RAW["models"]
PRICED = [entry for entry in ENTRIES if entry["input_price"] is not None]
# Vendors' own sites: a price must have been read on one of them.
VENDOR_SITES = re.compile(
    r"^https://(developers\.openai\.com|platform\.openai\.com|openai\.com"
    r"|platform\.claude\.com|docs\.anthropic\.com|www\.anthropic\.com|claude\.com"
    r"|ai\.google\.dev|cloud\.google\.com)/"
)


def info(**prices: str | None) -> ModelInfo:
    values = {key: None if value is None else Decimal(value) for key, value in prices.items()}
    return ModelInfo(
        id="test-model",
        provider="openai",
        context_window=None,
        input_price=values.get("input_price"),
        output_price=values.get("output_price"),
        cached_input_price=values.get("cached_input_price"),
    )


@pytest.fixture
def one_model(monkeypatch):
    """Replaces the catalog with one entry, built from prices given as strings."""

    def use(**prices: str | None) -> None:
        monkeypatch.setattr(catalog, "_catalog", lambda: {"test-model": info(**prices)})

    return use


# -- lookup ------------------------------------------------------------------------------------
def test_lookup_finds_an_exact_id():
    found = lookup("claude-haiku-4-5")

    assert found is not None
    assert (found.id, found.provider, found.context_window) == (
        "claude-haiku-4-5",
        "anthropic",
        200000,
    )
    assert (found.input_price, found.output_price, found.cached_input_price) == (
        Decimal("1"),
        Decimal("5"),
        Decimal("0.1"),
    )


def test_lookup_finds_an_alias():
    found = lookup("claude-3-5-haiku-latest")

    assert found is not None
    assert found.id == "claude-3-5-haiku"


@pytest.mark.parametrize(
    ("snapshot", "base"),
    [
        ("gpt-5-nano-2025-08-07", "gpt-5-nano"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0"),
        ("gemini-2.0-flash-001", "gemini-2.0-flash"),
    ],
)
def test_a_dated_snapshot_falls_back_to_its_base_id(snapshot, base):
    found = lookup(snapshot)

    assert found is not None
    assert found.id == base


def test_a_snapshot_priced_apart_from_its_base_has_its_own_entry():
    found = lookup("gpt-4o-2024-05-13")

    assert found is not None
    assert found.id == "gpt-4o-2024-05-13"


@pytest.mark.parametrize("variant", ["o3-pro", "gpt-5-nano-preview", "gpt-4o-audio-preview"])
def test_a_variant_of_a_known_model_is_not_taken_for_it(variant):
    assert lookup(variant) is None


@pytest.mark.parametrize("model", ["my-finetune", "llama3.2", "", "gpt-5-nano-2025"])
def test_an_unknown_id_is_none(model):
    assert lookup(model) is None


# -- price_of ----------------------------------------------------------------------------------
def test_price_of_charges_cached_input_at_the_cached_price(one_model):
    one_model(input_price="1", output_price="5", cached_input_price="0.10")
    usage = TokenUsage(input_tokens=1000, cached_tokens=200, output_tokens=500)

    # 800 fresh input tokens at $1, 200 cached at $0.10 and 500 output at $5, per million.
    assert price_of("test-model", usage) == Decimal("0.00332000")


def test_price_of_charges_cached_input_at_the_input_price_when_there_is_no_cached_price(
    one_model,
):
    one_model(input_price="2", output_price="8", cached_input_price=None)
    usage = TokenUsage(input_tokens=1000, cached_tokens=400, output_tokens=100)

    assert price_of("test-model", usage) == Decimal("0.00280000")


def test_price_of_never_counts_more_cached_tokens_than_input_tokens(one_model):
    one_model(input_price="1", output_price="1", cached_input_price="0")
    usage = TokenUsage(input_tokens=100, cached_tokens=500, output_tokens=0)

    assert price_of("test-model", usage) == Decimal(0)


def test_price_of_a_real_entry_uses_its_prices():
    usage = TokenUsage(input_tokens=1_000_000, cached_tokens=0, output_tokens=1_000_000)

    assert price_of("claude-sonnet-4-5-20250929", usage) == Decimal("18.00000000")


@pytest.mark.parametrize(
    "prices",
    [
        {"input_price": None, "output_price": "1"},
        {"input_price": "1", "output_price": None},
    ],
)
def test_price_of_a_model_without_a_known_price_is_none(one_model, prices):
    one_model(**prices)

    assert price_of("test-model", TokenUsage(input_tokens=10, output_tokens=10)) is None


def test_price_of_an_uncatalogued_model_is_none():
    assert price_of("my-finetune", TokenUsage(input_tokens=10, output_tokens=10)) is None


def test_price_of_a_catalogued_model_with_null_prices_is_none(monkeypatch):
    from agentloop.providers import catalog

    unpriced = catalog.ModelInfo("future-model", "openai", 1000, None, None, None)
    monkeypatch.setattr(catalog, "_catalog", lambda: {"future-model": unpriced})
    assert lookup("future-model") is unpriced
    assert price_of("future-model", TokenUsage(input_tokens=10)) is None


# -- the data ----------------------------------------------------------------------------------
def test_the_catalog_says_where_its_prices_come_from_and_when():
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", RAW["about"])
    assert "USD per million tokens" in RAW["about"]


#: the fields of a price entry, in ``models`` and in ``clouds`` alike.
PRICE_FIELDS = {
    "id",
    "provider",
    "context_window",
    "input_price",
    "output_price",
    "cached_input_price",
    "cache_write_price",
    "cache_write_1h_price",
    "source",
}


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["id"] for entry in ENTRIES])
def test_every_entry_is_well_formed(entry):
    assert set(entry) <= PRICE_FIELDS | {"thinking", "temperature", "aliases"}
    assert isinstance(entry["thinking"], bool)  # every entry says whether it thinks
    assert entry.get("temperature", True) is True or entry["thinking"]  # only reasoners refuse it
    assert_prices_are_well_formed(entry)


def assert_prices_are_well_formed(entry):
    assert entry["provider"] in providers.BUILTINS
    assert entry["context_window"] is None or (
        isinstance(entry["context_window"], int) and entry["context_window"] > 0
    )
    prices = [entry[key] for key in ("input_price", "output_price", "cached_input_price")]
    assert all(price is None or (isinstance(price, int | float) and price >= 0) for price in prices)
    # A model is either priced (input and output) or not at all; cached input is never dearer.
    assert (entry["input_price"] is None) == (entry["output_price"] is None)
    if entry["cached_input_price"] is not None:
        assert entry["input_price"] is not None
        assert entry["cached_input_price"] <= entry["input_price"]
    # Cache writes cost more than plain input, and an hour's more than five minutes'.
    if "cache_write_price" in entry:
        assert entry["input_price"] <= entry["cache_write_price"] <= entry["cache_write_1h_price"]


@pytest.mark.parametrize("entry", PRICED, ids=[entry["id"] for entry in PRICED])
def test_every_price_names_the_vendor_page_it_was_read_on(entry):
    assert VENDOR_SITES.match(entry["source"] or ""), entry["source"]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-5-mini", True),
        ("gpt-4.1-mini", False),
        ("gpt-4.1-mini-2025-04-14", False),  # a snapshot is its base model
        ("claude-3-5-haiku-latest", False),  # an alias
        ("claude-haiku-4-5-20251001", True),
        ("gemini-2.0-flash-001", False),
        ("our-fine-tuned-model", None),  # not listed: unknown
    ],
)
def test_the_catalog_says_which_models_think(model, expected):
    assert thinks(model) is expected


def test_the_catalog_says_which_models_take_a_temperature():
    assert [accepts(m, "temperature") for m in ("gpt-4.1-mini", "o4-mini-2025-04-16", "x")] == [
        True,
        False,
        None,
    ]
    with pytest.raises(ValueError, match="No catalog option 'top_k'"):
        accepts("gpt-5", "top_k")


def test_ids_and_aliases_are_unique():
    names = [name for entry in ENTRIES for name in [entry["id"], *entry.get("aliases", [])]]

    assert len(names) == len(set(names))


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["id"] for entry in ENTRIES])
def test_every_id_written_without_a_provider_goes_to_its_provider(entry):
    assert providers.split_model(entry["id"])[0] == entry["provider"]


# -- Usage.cost end to end ---------------------------------------------------------------------
@pytest.fixture
def server() -> Iterator[Recorder]:
    """An OpenAI Chat Completions server behind MockTransport, registered as "priced"."""
    with serving("priced", OpenAIProvider, api_key="sk-test") as recorder:
        yield recorder


@pytest.mark.django_db
def test_usage_cost_is_filled_for_a_catalogued_model(server, user):
    server.responses.append(
        chat_completion(
            model="gpt-5-nano-2025-08-07",
            prompt_tokens=1000,
            completion_tokens=500,
            prompt_tokens_details={"cached_tokens": 200},
        )
    )
    chat = Chat.objects.create(model="priced:gpt-5-nano", owner=user)

    chat.ask("Hi")

    (usage,) = Usage.objects.filter(chat=chat)
    assert (usage.status, usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (
        "succeeded",
        1000,
        200,
        500,
    )
    # 800 * $0.05 + 200 * $0.005 + 500 * $0.40, per million tokens.
    assert usage.cost == Decimal("0.00024100")


@pytest.mark.django_db
def test_usage_cost_is_null_for_a_model_without_a_known_price(server, user):
    server.responses.append(
        chat_completion(model="my-finetune", prompt_tokens=10, completion_tokens=5)
    )
    chat = Chat.objects.create(model="priced:my-finetune", owner=user)

    chat.ask("Hi")

    (usage,) = Usage.objects.filter(chat=chat)
    assert (usage.status, usage.input_tokens, usage.cost) == ("succeeded", 10, None)


@pytest.mark.django_db
def test_a_chat_without_a_model_is_priced_as_the_default_model(server, user):
    server.responses.append(chat_completion(prompt_tokens=1000, completion_tokens=0))
    chat = Chat.objects.create(owner=user)

    with override_settings(AGENTLOOP={"DEFAULT_MODEL": "priced:gpt-5-nano"}):
        chat.ask("Hi")

    (usage,) = Usage.objects.filter(chat=chat)
    assert (usage.provider, usage.model, usage.status) == ("priced", "gpt-5-nano", "succeeded")
    assert usage.cost == Decimal("0.00005000")
    assert server.bodies[0]["model"] == "gpt-5-nano"


# -- clouds: a model served through a cloud provider is priced at the cloud's rates ------------
CLOUDS = RAW.get("clouds", [])


@pytest.mark.parametrize("entry", CLOUDS, ids=[f"{e['provider']}:{e['id']}" for e in CLOUDS])
def test_every_cloud_entry_is_well_formed_and_names_its_source(entry):
    # Whether a model thinks or takes a temperature is the model's: its vendor entry says.
    assert set(entry) <= PRICE_FIELDS
    assert_prices_are_well_formed(entry)
    assert entry["source"]
    if entry["input_price"] is not None:
        test_every_price_names_the_vendor_page_it_was_read_on(entry)


def test_cloud_entries_are_unique():
    keys = [(entry["provider"], entry["id"]) for entry in CLOUDS]
    assert len(keys) == len(set(keys))


@pytest.mark.usefixtures("without_genai_prices")  # the catalog alone (tests/test_prices.py)
def test_a_call_through_vertex_ai_takes_the_vertex_entry_not_the_gemini_apis():
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)

    through_vertex = lookup("gemini-2.5-flash", provider="vertexai")

    assert through_vertex is not None and through_vertex.provider == "vertexai"
    assert through_vertex.context_window == 1048576
    assert price_of("gemini-2.5-flash", usage, provider="vertexai") is None  # not confirmed
    assert price_of("gemini-2.5-flash-001", usage, provider="vertexai") is None  # a snapshot
    assert price_of("gemini-2.5-flash", usage, provider="gemini") == Decimal("2.80000000")
    assert lookup("gemini-2.5-flash").provider == "gemini"  # type: ignore[union-attr]


def test_a_cloud_entry_takes_the_models_flags_from_its_vendor_entry():
    through_azure = lookup("gpt-5-nano", provider="azure")
    vendor = lookup("gpt-5-nano")

    assert through_azure is not None and vendor is not None and through_azure.provider == "azure"
    assert (through_azure.thinking, through_azure.temperature) == (True, False)
    assert (through_azure.thinking, through_azure.temperature) == (
        vendor.thinking,
        vendor.temperature,
    )


@pytest.mark.usefixtures("without_genai_prices")  # the catalog alone (tests/test_prices.py)
def test_a_call_through_a_cloud_is_never_priced_at_the_vendor_apis_rates():
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    priced = [entry["id"] for entry in PRICED if entry["provider"] == "openai"]

    assert catalog.cloud_providers() == {"vertexai", "azure"}
    assert price_of(priced[0], usage) is not None
    # A model the cloud has no entry for costs null through it, not the vendor's price.
    assert lookup(priced[0], provider="azure") is None
    assert price_of(priced[0], usage, provider="azure") is None
    assert price_of("gemini-2.5-flash", usage, provider="vertexai") is None
    # A provider that is no cloud is priced from the vendors' entries, whatever its name.
    assert price_of(priced[0], usage, provider="priced") == price_of(priced[0], usage)


def test_azure_entries_are_clouds_entries_not_prefixed_model_ids():
    assert not [entry["id"] for entry in ENTRIES if ":" in entry["id"]]
    assert {entry["id"] for entry in CLOUDS if entry["provider"] == "azure"} >= {"gpt-5-nano"}


@pytest.mark.usefixtures("without_genai_prices")  # the catalog alone (tests/test_prices.py)
def test_a_cloud_provider_configured_under_another_name_is_priced_as_that_cloud():
    from agentloop.providers.vertex import VertexAIProvider

    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    gemini_price = price_of("gemini-2.5-flash", usage, provider="gemini")

    provider = VertexAIProvider(name="vertex-eu", project="p", location="europe-west4")

    assert gemini_price is not None
    assert provider.cost("gemini-2.5-flash", usage) is None  # Vertex AI's entry, unpriced
