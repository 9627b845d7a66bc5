"""The admin's usage charts in a real browser: the seeded days and models are drawn as bars,
the top owners as bars, the range form redraws them, and names with markup stay text.

Chromium (Playwright) against ``manage.py runserver`` on the test database (the ``site`` and
``browser`` fixtures of tests/conftest.py). With ``AGENTLOOP_SCREENSHOTS=1`` the screenshot
is written to ``docs/images/usage-charts.png`` (docs/usage-charts.md shows it).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from agentloop.models import Usage
from tests.browsers import open_tab, screenshot

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: skip without Chromium/Playwright; the ORM between page actions
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright"),
]

MODELS = {  # model -> (cost of one call, input tokens)
    "gpt-4.1": ("0.0420", 9000),
    "gpt-4.1-mini": ("0.0060", 12000),
    "claude-sonnet-4-5": ("0.0310", 7000),
}
DAYS = 14
MARKUP = '<img src=x onerror="document.title=1">mallory'


@pytest.fixture
def usage(django_user_model) -> None:
    owners = [
        django_user_model.objects.create_user(username=name)
        for name in ("ada", "grace", "linus", MARKUP)
    ]
    today = timezone.localdate()
    rows = []
    for back in range(DAYS):
        day = today - timedelta(days=back)
        noon = timezone.make_aware(datetime(day.year, day.month, day.day, 12))
        for number, (model, (cost, tokens)) in enumerate(MODELS.items()):
            calls = 1 + (back * 7 + number * 3) % 5  # some variety between the days
            for call in range(calls):
                owner = owners[(back + number + call) % len(owners)]
                provider = "anthropic" if model.startswith("claude") else "openai"
                rows.append(
                    Usage(
                        owner=owner,
                        provider=provider,
                        model=model,
                        status="succeeded",
                        input_tokens=tokens,
                        output_tokens=tokens // 8,
                        cost=Decimal(cost),
                        created_at=noon,
                    )  # fmt: skip
                )
    Usage.objects.bulk_create(rows)


def test_the_charts_draw_the_seeded_days_models_and_owners(
    browser, site, django_user_model, usage, tmp_path: Path
):
    django_user_model.objects.create_superuser(username="root", password="pw")
    with open_tab(browser) as page:
        page.goto(f"{site.url}/admin/login/?next=/admin/agentloop/usage/")
        page.fill("input[name=username]", "root")
        page.fill("input[name=password]", "pw")
        page.click("input[type=submit]")
        page.click("text=Charts")  # the link on the usage list
        page.wait_for_selector("#cost-chart svg")

        bars = page.locator("#cost-chart svg rect.bar")
        assert bars.count() == DAYS * len(MODELS)  # every model spent something every day
        assert page.locator("#tokens-chart svg rect.bar").count() == DAYS * len(MODELS)
        legend = page.locator("#cost-chart svg text").all_text_contents()
        assert {"openai:gpt-4.1", "openai:gpt-4.1-mini", "anthropic:claude-sonnet-4-5"} <= set(
            legend
        )
        owners = page.locator("#owners-chart svg rect.bar")
        assert owners.count() == 4
        texts = page.locator("#owners-chart svg text").all_text_contents()
        assert MARKUP[:29] + "…" in texts  # shown as text (cut to fit), never run
        assert MARKUP in page.locator("#owners-chart td").all_text_contents()
        assert page.title() != "1"
        box = page.locator("#cost-chart svg").bounding_box()
        content = page.locator("#content-main").bounding_box()
        assert box is not None and content is not None
        assert box["width"] >= content["width"] * 0.95  # as wide as the page lets it
        shot = screenshot(page, "usage-charts.png", tmp_path)

        # The range form redraws the charts for the days chosen.
        today = timezone.localdate()
        page.fill("input[name=start]", f"{today - timedelta(days=2):%Y-%m-%d}")
        page.fill("input[name=end]", f"{today:%Y-%m-%d}")
        page.click("#agentloop-range button[type=submit]")
        page.wait_for_url("**start=*")
        assert page.locator("#cost-chart svg rect.bar").count() == 3 * len(MODELS)

    assert shot.exists()
