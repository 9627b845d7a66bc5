"""The admin's usage charts (agentloop.admin.usage_charts, docs/usage-charts.md): the grouped
queries, the page, its range form, who may see it, and the SVG (labels escaped). The page in
a real browser is tests/test_usage_charts_browser.py."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentloop.admin.svg_charts import Series, horizontal_bars, nice_ticks, stacked_bars
from agentloop.admin.usage_charts import (
    daily_by_model,
    daily_by_model_query,
    top_owners,
    top_owners_query,
)
from agentloop.models import Usage

pytestmark = pytest.mark.django_db

URL = "/admin/agentloop/usage/charts/"
MARKUP = '<img src=x onerror="alert(1)">'


def at(day: date, hour: int = 12) -> datetime:
    return timezone.make_aware(datetime(day.year, day.month, day.day, hour))


def _day(value: date | datetime) -> date:
    return timezone.localtime(value).date() if isinstance(value, datetime) else value


def figure(body: str, name: str) -> str:
    """The page's figure ``name`` (a chart and its table)."""
    return body.split(f'id="{name}"')[1].split("</figure>")[0]


def spend(owner, day: date, model: str, cost: str, tokens: int = 100, hour: int = 12) -> None:
    Usage.objects.create(
        owner=owner, provider="openai", model=model, status="succeeded", input_tokens=tokens,
        output_tokens=tokens // 10, cost=Decimal(cost), created_at=at(day, hour),
    )  # fmt: skip


@pytest.fixture
def seeded(user, django_user_model):
    """Three days of two models and two owners (one with markup in the name)."""
    other = django_user_model.objects.create_user(username=MARKUP)
    today = timezone.localdate()
    for back in range(3):
        day = today - timedelta(days=back)
        spend(user, day, "gpt-4.1-mini", "0.10")
        spend(other, day, "gpt-4.1", "1.00", tokens=1000)
    spend(user, today - timedelta(days=40), "gpt-4.1", "9.00")  # outside the default range
    return today


def test_daily_by_model_sums_each_day_and_model_in_one_query(seeded, django_assert_num_queries):
    start = seeded - timedelta(days=2)

    with django_assert_num_queries(1):
        rows = daily_by_model(Usage.objects.all(), start, seeded)

    assert [
        (_day(r["day"]), r["model"], r["cost"], r["input_tokens"], r["attempts"]) for r in rows
    ][:2] == [
        (start, "gpt-4.1", Decimal("1.00"), 1000, 1),
        (start, "gpt-4.1-mini", Decimal("0.10"), 100, 1),
    ]  # fmt: skip
    assert len(rows) == 6


def test_the_range_includes_its_last_day_to_midnight_and_nothing_after(user):
    day = date(2026, 3, 10)
    spend(user, day, "m", "1", hour=0)
    spend(user, day, "m", "2", hour=23)
    spend(user, day + timedelta(days=1), "m", "4", hour=0)

    rows = daily_by_model(Usage.objects.all(), day, day)

    assert [r["cost"] for r in rows] == [Decimal("3")]


def test_top_owners_orders_by_cost_and_names_them(seeded, user, django_assert_num_queries):
    with django_assert_num_queries(2):  # the grouped query, then the few users by key
        rows = top_owners(Usage.objects.all(), seeded - timedelta(days=29), seeded)

    assert [(r["owner"], r["cost"], r["tokens"], r["attempts"]) for r in rows] == [
        (MARKUP, Decimal("3.00"), 3300, 3),
        ("ada", Decimal("0.30"), 330, 3),
    ]


def test_anonymised_usage_shows_as_no_owner(user):
    spend(None, timezone.localdate(), "m", "5")

    (row,) = top_owners(Usage.objects.all(), timezone.localdate(), timezone.localdate())

    assert row["owner"] == "(no owner)"


def test_the_page_draws_a_bar_per_day_and_model_with_every_label_escaped(seeded, admin_client):
    response = admin_client.get(URL)

    assert response.status_code == 200
    body = response.content.decode()
    cost_chart = figure(body, "cost-chart")
    assert cost_chart.count('<rect class="bar"') == 6  # 3 days x 2 models
    assert "openai:gpt-4.1-mini on" in cost_chart
    assert MARKUP not in body
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in body
    assert "cost 3.3000" in body  # the range's totals (the row 40 days back is outside)


def test_the_page_costs_a_fixed_number_of_queries(seeded, admin_client, user):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(URL).status_code == 200
        return len(captured)

    before = queries()
    for back in range(20):
        spend(user, seeded - timedelta(days=back), f"model-{back}", "0.01")
    assert queries() == before


def test_a_range_past_its_end_is_refused_in_one_line_and_the_default_shown(seeded, admin_client):
    response = admin_client.get(URL, {"start": "2026-05-02", "end": "2026-05-01"})

    body = response.content.decode()
    assert "The last day comes before the first." in body
    assert figure(body, "cost-chart").count('<rect class="bar"') == 6


def test_a_range_too_long_or_not_a_date_is_refused(admin_client):
    long = admin_client.get(URL, {"start": "2020-01-01", "end": "2026-01-01"})
    assert "Choose at most 400 days." in long.content.decode()
    garbage = admin_client.get(URL, {"start": "yesterday", "end": "2026-01-01"})
    assert "Enter a valid date." in garbage.content.decode()


def test_a_preset_shows_the_last_days(seeded, admin_client):
    body = admin_client.get(URL, {"days": "90"}).content.decode()
    assert figure(body, "cost-chart").count('<rect class="bar"') == 7  # the old row too


def test_a_range_without_usage_says_so(admin_client):
    body = admin_client.get(URL, {"start": "2001-01-01", "end": "2001-01-31"}).content.decode()
    assert "No usage from 2001-01-01 to 2001-01-31." in body
    assert "agentloop-chart" not in body


def test_the_usage_list_links_to_the_charts(admin_client):
    assert URL in admin_client.get("/admin/agentloop/usage/").content.decode()


def test_staff_without_the_view_permission_get_403_and_others_the_login(client, django_user_model):
    assert client.get(URL).status_code == 302  # to the admin's login
    staff = django_user_model.objects.create_user(username="clerk", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(URL).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_usage"))
    assert client.get(URL).status_code == 200


@pytest.mark.skipif(connection.vendor != "postgresql", reason="INCLUDE indexes: PostgreSQL")
def test_the_covering_index_holds_every_column_both_queries_read(seeded):
    """The index covers both queries (what lets PostgreSQL answer them from the index alone:
    an Index Only Scan once vacuum has marked the pages visible, as the EXPLAIN at a million
    rows in docs/usage-charts.md shows); whether a test transaction's tiny table gets one
    depends on its visibility map, so the plan is only asked to use the index."""
    start = seeded - timedelta(days=29)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'agentloop_usage_day_idx'"
        )
        (definition,) = cursor.fetchone()
        cursor.execute("SET enable_seqscan = off")  # a small table: ask what the index can do
        try:
            plans = [
                queryset.explain()
                for queryset in (
                    daily_by_model_query(Usage.objects.all(), start, seeded),
                    top_owners_query(Usage.objects.all(), start, seeded),
                )
            ]
        finally:
            cursor.execute("RESET enable_seqscan")

    assert (
        "(created_at) INCLUDE (provider, model, owner_id, cost, input_tokens, output_tokens)"
        in (definition)
    ), definition
    for plan in plans:
        assert "using agentloop_usage_day_idx" in plan or "on agentloop_usage_day_idx" in plan, plan


# -- the SVG ---------------------------------------------------------------------------------------
def test_ticks_are_round_and_reach_the_top():
    assert nice_ticks(0) == [0.0, 1.0]
    assert nice_ticks(7.3) == [0, 2, 4, 6, 8]
    assert nice_ticks(1234)[-1] >= 1234


def test_a_stacked_chart_escapes_its_labels_and_skips_empty_segments():
    days = [date(2026, 1, 1), date(2026, 1, 2)]
    svg = stacked_bars(
        days, [Series(MARKUP, [1, 0]), Series("b & c", [2, 3])], title="<t>", formatter=str
    )

    assert svg.count('<rect class="bar"') == 3
    assert MARKUP not in svg and "<t>" not in svg
    assert "b &amp; c" in svg
    assert re.search(r'aria-label="&lt;t&gt;"', svg)


def test_a_horizontal_chart_draws_one_bar_per_item():
    svg = horizontal_bars([("a", 3, "x"), ("<b>", 1, "y")], title="Top", formatter=str)
    assert svg.count('<rect class="bar"') == 2
    assert "&lt;b&gt;" in svg
