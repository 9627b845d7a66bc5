"""What guardrails decided, on the admin's chat timeline in a real browser: each outcome under
the message or tool call it judged, a blocked answer marked, nothing wider than the page, and
guardrail text shown as text.

Chromium (Playwright) against ``manage.py runserver`` on the test database (the ``site`` and
``browser`` fixtures of tests/conftest.py). With ``AGENTLOOP_SCREENSHOTS=1`` the screenshot is
written to ``docs/images/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentloop.models import Chat, ChatState, Message, ToolCall
from tests.browsers import TIMEOUT_MS, screenshot

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright"),
]

WIDTH = 1280
MARKUP = '<img src=x onerror="document.title=1">'


@pytest.fixture
def wide_page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert errors == []


@pytest.fixture
def guarded_chat(django_user_model) -> Chat:
    """A chat as guardrails leave it: a replaced message, a blocked tool call, a blocked
    answer (rows written directly: the page only reads them)."""
    owner = django_user_model.objects.create_user(username="ada", password="pw")
    chat = Chat.objects.create(
        title="Refunds",
        owner=owner,
        model="openai:gpt-4.1-mini",
        state=ChatState.STOPPED,
        stop_reason="guardrail no_leaks: the answer names an internal host",
        guardrails=["myapp.guardrails.redact_cards", "myapp.guardrails.refund_cap"],
    )
    Message.objects.create(
        chat=chat,
        role="user",
        content="Refund 500 on card [card], order A-1",
        guardrails=[
            {"guardrail": "redact_cards", "stage": "input", "decision": "replaced",
             "original": "Refund 500 on card 4242 4242 4242 4242, order A-1",
             "duration_ms": 3},
            {"guardrail": "moderation", "stage": "input", "decision": "passed",
             "parallel": True, "duration_ms": 412},
        ],
    )  # fmt: skip
    asking = Message.objects.create(chat=chat, role="assistant", content="")
    call = ToolCall.objects.create(
        chat=chat,
        message=asking,
        call_id="call_1",
        name="refund",
        arguments={"order": "A-1", "amount": 500},
        state="failed",
        guardrails=[
            {"guardrail": "refund_cap", "stage": "tool", "decision": "blocked",
             "reason": f"refunds over 100 need a person {MARKUP}", "duration_ms": 1},
        ],
    )  # fmt: skip
    Message.objects.create(
        chat=chat,
        role="tool",
        tool_call=call,
        is_error=True,
        content="Blocked by guardrail refund_cap: refunds over 100 need a person; "
        "the tool was not run.",
    )
    Message.objects.create(
        chat=chat,
        role="assistant",
        status="blocked",
        content="Ask ops at db1.corp.internal.",
        guardrails=[
            {"guardrail": "no_leaks", "stage": "output", "decision": "blocked",
             "reason": "the answer names an internal host", "duration_ms": 2},
        ],
    )  # fmt: skip
    return chat


def test_the_timeline_shows_guardrail_outcomes_within_the_page(
    wide_page, site, django_user_model, guarded_chat, tmp_path: Path
):
    django_user_model.objects.create_superuser(username="root", password="pw")
    url = f"/admin/agentloop/chat/{guarded_chat.pk}/change/"
    wide_page.goto(f"{site.url}/admin/login/?next={url}")
    wide_page.fill("input[name=username]", "root")
    wide_page.fill("input[name=password]", "pw")
    wide_page.click("input[type=submit]")
    wide_page.wait_for_url(f"{site.url}{url}")

    shot = screenshot(wide_page, "admin-guardrails-timeline.png", tmp_path)
    seen = wide_page.evaluate(
        """() => ({
          outcomes: [...document.querySelectorAll('.agentloop-guardrail')].map(
            li => li.textContent.replace(/\\s+/g, ' ').trim()),
          blocked: [...document.querySelectorAll('.agentloop-flag-blocked')].length,
          pageWidth: document.documentElement.scrollWidth,
          viewport: window.innerWidth,
          images: document.querySelectorAll('.agentloop-guardrails img').length,
          title: document.title,
        })"""
    )

    assert shot.exists()
    assert seen["outcomes"] == [
        "guardrail redact_cards replaced 3 ms what it replaced"
        "Refund 500 on card 4242 4242 4242 4242, order A-1",
        "guardrail moderation passed during the model call 412 ms",
        f"guardrail refund_cap blocked 1 ms refunds over 100 need a person {MARKUP}",
        "guardrail no_leaks blocked 2 ms the answer names an internal host",
    ]
    assert seen["blocked"] == 1
    assert seen["pageWidth"] <= seen["viewport"], seen
    assert seen["images"] == 0 and seen["title"] != "1"  # guardrail text stays text
