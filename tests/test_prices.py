"""Prices of models (issue 41, defect 10): ``AGENTLOOP["PRICES"]`` wins over the catalog and
genai-prices; genai-prices (the ``prices`` extra) prices what the catalog doesn't; and the
system check agentloop.W012 warns when a cost budget is set and a model has no price."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.management import call_command
from django.test import override_settings

from agentloop.budgets.budget_checks import check_prices
from agentloop.conf import settings_errors
from agentloop.messages import TokenUsage
from agentloop.models import Budget, Chat
from agentloop.providers import prices
from agentloop.providers.catalog import price_of
from tests.price_sources import without_genai_prices  # noqa: F401 (a fixture)

MILLION = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
NOVA = "bedrock:amazon.nova-2-lite-v1:0"  # priced by neither the catalog nor genai-prices
COST = {"cost_per_day": "20.00"}


@pytest.fixture
def genai_prices():
    pytest.importorskip("genai_prices")
    prices._genai.cache_clear()
    yield
    prices._genai.cache_clear()


def warnings(**agentloop):
    with override_settings(AGENTLOOP=agentloop):
        return [(found.id, found.msg, found.hint) for found in check_prices()]


# -- where a price comes from -------------------------------------------------------------------
def test_prices_in_settings_win_over_the_catalog_by_configured_name_then_kind():
    chosen = {
        "PRICES": {
            "openai:gpt-4.1": {"input_price": "1", "output_price": "2"},
            "openai-eu:gpt-4.1": {"input_price": "3", "output_price": "4"},
        }
    }
    with override_settings(AGENTLOOP=chosen):
        assert price_of("gpt-4.1", MILLION, "openai") == Decimal("3")  # not the catalog's 10
        assert price_of("gpt-4.1-2025-04-14", MILLION, "openai") == Decimal("3")  # a snapshot
        assert price_of("gpt-4.1", MILLION, "openai", configured="openai-eu") == Decimal("7")
    assert price_of("gpt-4.1", MILLION, "openai") == Decimal("10")


def test_a_price_in_settings_prices_cache_reads_and_writes_as_the_catalog_does():
    rates = {"input_price": "1", "output_price": "0", "cached_input_price": "0.1",
             "cache_write_price": "1.25", "cache_write_1h_price": "2"}  # fmt: skip
    usage = TokenUsage(input_tokens=4_000_000, output_tokens=0, cache_read_tokens=1_000_000,
                       cache_write_tokens=2_000_000, cache_write_1h_tokens=1_000_000)  # fmt: skip
    with override_settings(AGENTLOOP={"PRICES": {"azure:m": rates}}):
        assert price_of("m", usage, "azure") == Decimal("1") + Decimal("0.1") + Decimal(
            "1.25"
        ) + Decimal("2")


def test_genai_prices_prices_the_clouds_the_catalog_does_not(genai_prices):
    assert price_of("gemini-2.5-flash", MILLION, "vertexai") == Decimal("2.80")
    found = price_of("us.anthropic.claude-haiku-4-5-20251001-v1:0", MILLION, "bedrock")
    assert found is not None and found > 0
    assert price_of("amazon.nova-2-lite-v1:0", MILLION, "bedrock") is None  # it has none
    # Its Azure knows gpt-5-nano only as OpenAI's model, at OpenAI's list price: not taken.
    assert price_of("gpt-5-nano", MILLION, "openai") == Decimal("0.45")
    assert price_of("gpt-5-nano", MILLION, "azure") is None
    assert price_of("llama3", MILLION, "ollama") is None  # a local model: no provider there
    # The catalog's own prices stay first.
    assert price_of("gemini-2.5-pro", MILLION, "gemini") == Decimal("11.25")


def test_a_model_genai_prices_lacks_is_looked_for_once_per_process(genai_prices, monkeypatch):
    import genai_prices as genai

    looked = []
    real = genai.calc_price

    def counted(*args, **kwargs):
        looked.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(genai, "calc_price", counted)
    monkeypatch.setattr(prices, "_unpriced", {})
    for _ in range(3):  # a fine-tune's id: unknown to the catalog and to genai-prices
        assert price_of("ft:gpt-4.1-mini:acme::abc123", MILLION, "openai") is None
        assert price_of("gpt-5-nano", MILLION, "azure") is None  # only another vendor's
        assert price_of("gemini-2.5-flash", MILLION, "vertexai") == Decimal("2.80")
    assert looked.count("ft:gpt-4.1-mini:acme::abc123") == 1
    assert looked.count("gpt-5-nano") == 1
    assert looked.count("gemini-2.5-flash") == 3  # a price found is asked for each time


@pytest.mark.usefixtures("without_genai_prices")
def test_without_genai_prices_the_clouds_are_unpriced():
    assert price_of("gemini-2.5-flash", MILLION, "vertexai") is None
    assert price_of("gpt-5-nano", MILLION, "azure") is None


def test_a_price_in_settings_must_be_provider_model_with_amounts():
    assert "PRICES" in settings_errors(
        {"PRICES": {"gpt-4.1": {"input_price": 1, "output_price": 1}}}
    )
    assert "PRICES" in settings_errors({"PRICES": {"azure:m": {"input_price": "free"}}})
    assert "PRICES" not in settings_errors(
        {"PRICES": {"azure:m": {"input_price": "0.05", "output_price": 0.4}}}
    )


# -- W012 ---------------------------------------------------------------------------------------
def test_w012_warns_of_an_unpriced_model_under_a_cost_budget():
    found = warnings(BUDGETS=COST, DEFAULT_MODEL=NOVA)

    assert found == [
        (
            "agentloop.W012",
            f"A cost budget is set, but model {NOVA!r} (DEFAULT_MODEL) has no known price: its "
            "calls cost $0 against every cost budget.",
            f'Give its price in AGENTLOOP["PRICES"][{NOVA!r}], install the "prices" extra '
            '(genai-prices), or hold it with a tokens budget: see "Prices" in Budgets and quotas.',
        )
    ]


@pytest.mark.usefixtures("without_genai_prices")
def test_w012_names_the_models_of_rate_limits_and_concurrency_too():
    found = warnings(
        BUDGETS={"cost_per_month": "300"},
        RATE_LIMITS={"vertexai:gemini-2.5-flash": {"requests_per_minute": 60}, "openai": {}},
        MODEL_CONCURRENCY={"azure:gpt-5-nano": 4, "default": 10},
    )

    assert [(msg.split(" (")[0], msg.split("(")[1].split(")")[0]) for _, msg, _ in found] == [
        ("A cost budget is set, but model 'vertexai:gemini-2.5-flash'", "RATE_LIMITS"),
        ("A cost budget is set, but model 'azure:gpt-5-nano'", "MODEL_CONCURRENCY"),
    ]


def test_w012_is_quiet_once_the_model_has_a_price():
    priced = {NOVA: {"input_price": "0.30", "output_price": "2.50"}}
    assert warnings(BUDGETS=COST, DEFAULT_MODEL=NOVA, PRICES=priced) == []


def test_w012_is_quiet_without_a_cost_budget():
    assert warnings(BUDGETS={"tokens_per_day": 1_000_000}, DEFAULT_MODEL=NOVA) == []
    assert warnings(DEFAULT_MODEL=NOVA) == []
    assert warnings(BUDGETS=COST) == []  # the default model has a price


@pytest.mark.django_db
def test_w012_with_the_database_looks_at_the_models_chats_use(user, settings):
    Chat.objects.create(model=NOVA, owner=user)
    Chat.objects.create(model="gpt-4.1", owner=user)
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {}}  # counted, no limit yet
    assert check_prices(databases=["default"]) == []

    Budget.objects.create(subject=f"auth.user:{user.pk}", cost_per_day=Decimal("5"))
    found = check_prices(databases=["default"])

    assert [(f.id, f.obj) for f in found] == [("agentloop.W012", NOVA)]
    assert "(used by chats)" in found[0].msg


@pytest.mark.django_db  # Django 6's check command runs the database checks too
def test_manage_py_check_shows_w012(capsys):
    with override_settings(AGENTLOOP={"BUDGETS": COST, "DEFAULT_MODEL": NOVA}):
        call_command("check")
    assert "agentloop.W012" in capsys.readouterr().err
