"""The admin's chat list in a real browser at 1280 px: every column fits, long text is cut
with its whole value in a tooltip, and text from models and people stays text.

Chromium (Playwright) against ``manage.py runserver`` on the test database, as in
``tests/test_browser.py`` (the ``site`` and ``browser`` fixtures of tests/conftest.py). With
``AGENTLOOP_SCREENSHOTS=1`` the screenshot is written to ``docs/images/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from agentloop.models import Chat, ChatState, Message, ToolCall, Usage
from tests.browsers import TIMEOUT_MS, screenshot

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: skip without Chromium/Playwright; the ORM between page actions
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright"),
]

WIDTH = 1280
LONG_TITLE = (
    "Quarterly revenue reconciliation for the northern European subsidiaries "
    "and their intercompany loans, third quarter draft for the audit committee"
)
LONG_MODEL = "anthropic:claude-sonnet-4-5-20250929-extended-context-preview"
LONG_OWNER = "margaret.hamilton.apollo.guidance.computer.software"
MARKUP_TITLE = '<img src=x onerror="document.title=1">Not markup'


@pytest.fixture
def wide_page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture
def chats(django_user_model) -> list[Chat]:
    owner = django_user_model.objects.create_user(username=LONG_OWNER, password="pw")
    made = []
    for number in range(12):
        chat = Chat.objects.create(
            title=LONG_TITLE if number % 2 else f"{MARKUP_TITLE} {number}",
            model=LONG_MODEL,
            owner=owner,
            state=ChatState.WAITING if number % 3 == 0 else ChatState.IDLE,
        )
        message = Message.objects.create(chat=chat, role="assistant", content="Paying.")
        if number % 3 == 0:
            ToolCall.objects.create(
                chat=chat,
                message=message,
                call_id=f"call_{number}",
                name="transfer",
                arguments={"amount": 5000},
                state="waiting",
                wait_reason="approval",
            )
        Usage.objects.create(
            chat=chat,
            provider="anthropic",
            model=LONG_MODEL,
            status="succeeded",
            input_tokens=123456,
            output_tokens=65432,
            cost=Decimal("1234.567890"),
        )
        made.append(chat)
    return made


def log_in_to_admin(page, site, django_user_model) -> None:
    django_user_model.objects.create_superuser(username="root", password="pw")
    page.goto(f"{site.url}/admin/login/?next=/admin/agentloop/chat/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{site.url}/admin/agentloop/chat/")


FIT = """() => {
  const table = document.querySelector('#result_list');
  const box = table.parentElement;
  return {
    tableWidth: table.scrollWidth,
    boxWidth: box.clientWidth,
    pageWidth: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
    headers: [...table.querySelectorAll('thead th')].map(
      th => [th.textContent.trim(), th.getBoundingClientRect().right]),
    clipped: [...table.querySelectorAll('th, td')].filter(
      cell => cell.scrollWidth > cell.clientWidth).map(cell => cell.className),
    untitledCuts: [...table.querySelectorAll('.agentloop-cut')].filter(
      cut => cut.scrollWidth > cut.clientWidth && !cut.title).length,
  };
}"""


def test_the_chat_list_fits_1280_pixels(
    wide_page,
    site,
    django_user_model,
    chats,
    tmp_path: Path,
):
    log_in_to_admin(wide_page, site, django_user_model)

    shot = screenshot(wide_page, "admin-chat-list-1280.png", tmp_path)
    fit = wide_page.evaluate(FIT)

    assert shot.exists()
    assert fit["tableWidth"] <= fit["boxWidth"], fit
    assert fit["pageWidth"] <= fit["viewport"], fit
    for name, right in fit["headers"]:
        assert right <= fit["viewport"], f"column {name!r} ends at {right}px"
    assert fit["clipped"] == []  # no cell (header or body) hides part of its content ...
    assert fit["untitledCuts"] == 0  # ... except text cut with its whole value in a tooltip


def test_long_text_is_cut_with_the_whole_value_in_its_title(
    wide_page,
    site,
    django_user_model,
    chats,
):
    log_in_to_admin(wide_page, site, django_user_model)

    title_cell = wide_page.locator(f'#result_list [title="{LONG_TITLE}"]').first
    model_cell = wide_page.locator(f'#result_list [title="{LONG_MODEL}"]').first
    owner_cell = wide_page.locator(f'#result_list [title="{LONG_OWNER}"]').first

    assert title_cell.text_content().strip() == LONG_TITLE  # cut by CSS, not in the text
    assert model_cell.is_visible() and owner_cell.is_visible()
    assert wide_page.evaluate(
        "el => el.scrollWidth > el.clientWidth", title_cell.element_handle()
    )  # it is really cut: the rest is in the tooltip


def test_titles_from_models_and_people_are_shown_as_text(
    wide_page,
    site,
    django_user_model,
    chats,
):
    log_in_to_admin(wide_page, site, django_user_model)

    shown = wide_page.locator("#result_list tbody").inner_text()

    assert MARKUP_TITLE in shown  # the markup as characters ...
    assert wide_page.locator("#result_list img").count() == 0  # ... not an element
    assert wide_page.title() != "1"
