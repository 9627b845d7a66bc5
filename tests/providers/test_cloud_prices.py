"""A cost budget sees the clouds' models (issue 41, defect 10): Azure AI Foundry and Bedrock
calls, replayed from their recordings (../shared/fixtures/providers-cloud/, read in place),
are charged at the prices ``AGENTLOOP["PRICES"]`` gives them; they cost $0 against every
cost budget before (the catalog has no price for them)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentloop import providers
from agentloop.budgets import spend_of
from agentloop.models import Chat, Usage
from agentloop.providers.azure import AzureProvider
from agentloop.providers.bedrock import BedrockProvider
from tests.price_sources import without_genai_prices  # noqa: F401 (a fixture)
from tests.providers import cassettes

cassettes.require_fixtures(cassettes.CLOUD)

# The catalog and the settings alone: genai-prices would price some of these itself.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("aws_env", "without_genai_prices")]

AZURE = (
    "chat_basic_chat_functionality_azure_grok-4-1-fast-non-reasoning_can_have_a_basic_conversation"
)
BEDROCK = (
    "chat_basic_chat_functionality_bedrock_amazon_nova-2-lite-v1_0_can_have_a_basic_conversation"
)
#: per million tokens: an operator's own prices, unlike anyone's list price.
RATES = {"input_price": "2.00", "output_price": "10.00"}


def serve(name: str, provider_class: type, **options) -> cassettes.Cassette:
    """The cloud provider registered under its own name, answering with the recording."""
    cassette = cassettes.load(name, cassettes.CLOUD)
    provider = provider_class(api_key="test-key", transport=cassette.transport(), **options)
    providers.register(provider_class.name, provider)
    return cassette


def asked(name: str, provider_class: Any, options: dict[str, Any], model: str, user: Any) -> Any:
    """A chat of ``user`` on ``model`` that asked one question over the recording ``name``."""
    serve(name, provider_class, **options)
    try:
        chat = Chat.objects.create(model=model, owner=user)
        chat.ask("What's 2 + 2?")
    finally:
        providers.unregister(provider_class.name)
    return chat


CLOUDS = [
    pytest.param(
        AZURE, AzureProvider, {"endpoint": "https://rubyllm.services.ai.azure.com"},
        "azure:grok-4-1-fast-non-reasoning", "azure:grok-4-1-fast-non-reasoning", id="azure",
    ),
    pytest.param(
        BEDROCK, BedrockProvider, {"region": "us-east-1"},
        "bedrock:us.amazon.nova-2-lite-v1:0", "bedrock:amazon.nova-2-lite-v1:0", id="bedrock",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "provider_class", "options", "model", "key"), CLOUDS)
def test_a_cloud_model_priced_in_settings_counts_against_a_cost_budget(
    name, provider_class, options, model, key, settings, user
):
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "BUDGETS": {"cost_per_day": "1.00"},
        "PRICES": {key: RATES},
    }
    chat = asked(name, provider_class, options, model, user)

    usage = Usage.objects.get(chat=chat)
    tokens = (usage.input_tokens, usage.output_tokens)
    assert min(tokens) > 0
    expected = (Decimal(tokens[0]) * 2 + Decimal(tokens[1]) * 10) / 1_000_000
    assert usage.cost == expected
    assert spend_of(user).cost_per_day == expected  # counted against the budget


@pytest.mark.parametrize(("name", "provider_class", "options", "model", "key"), CLOUDS)
def test_without_a_price_a_cloud_model_costs_nothing_known(
    name, provider_class, options, model, key, settings, user
):
    """What the check (agentloop.W012) warns of: no price anywhere, no cost counted."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_day": "1.00"}}
    chat = asked(name, provider_class, options, model, user)

    assert Usage.objects.get(chat=chat).cost is None
    assert spend_of(user).cost_per_day == 0
