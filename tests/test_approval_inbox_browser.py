"""The approval inbox in a real browser: a reviewer filters the calls waiting across chats,
has invalid edited arguments refused (nothing changed, the draft kept, the reason shown),
approves with fixed arguments, denies another with a reason, and finds both decisions, with
who and when, under "Decided"; the background chat then runs the approved call. Text from
models and tools stays text.

Chromium (Playwright) against ``manage.py runserver`` on the test database (the ``site`` and
``browser`` fixtures of tests/conftest.py). With ``AGENTLOOP_SCREENSHOTS=1`` the screenshot is
written to ``docs/images/``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agentloop.models import Chat, ChatState, Message, ToolCall
from tests.browsers import open_tab, screenshot
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: skip without Chromium/Playwright; the ORM between page actions
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright", "no_run_left_behind"),
]

MARKUP = "<img src=x onerror=\"document.title='owned'\">"


def held_call(owner, title: str, name: str, arguments: dict, **fields) -> ToolCall:
    """A background chat (``rules`` model) whose call waits for a person, as a worker left it."""
    chat = Chat.objects.create(
        model="rules:test", owner=owner, title=title, state=ChatState.WAITING,
        tools=["tests.tools.transfer", "tests.tools.ask_manager"],
    )  # fmt: skip
    Message.objects.create(chat=chat, role="user", content=f"tools:{name}")
    message = Message.objects.create(chat=chat, role="assistant", content="")
    return ToolCall.objects.create(
        chat=chat, message=message, call_id=f"call_{name}_{chat.pk}", name=name,
        arguments=arguments, state="waiting", waiting_since=timezone.now() - timedelta(hours=2),
        **fields,
    )  # fmt: skip


@pytest.fixture
def inbox(django_user_model):
    ada = django_user_model.objects.create_user(username="ada", password="pw")
    django_user_model.objects.create_superuser(username="root", password="pw")
    return [
        held_call(ada, f"Pay Bob {MARKUP}", "transfer", {"amount": 500, "to": "bob"},
                  wait_reason="approval"),
        held_call(ada, "Pay Carol", "transfer", {"amount": 70, "to": "carol"},
                  wait_reason="approval"),
        held_call(None, "Ask", "ask_manager", {"question": "Why?"}, wait_reason="question",
                  question=f"Why? {MARKUP}"),
    ]  # fmt: skip


def test_a_reviewer_works_through_the_inbox(browser, site, inbox, tmp_path: Path):
    bob, carol, _ask = inbox
    with open_tab(browser) as page:
        page.goto(f"{site.url}/admin/login/?next=/admin/agentloop/chat/")
        page.fill("input[name=username]", "root")
        page.fill("input[name=password]", "pw")
        page.click("input[type=submit]")
        page.click("a.agentloop-inbox-link")
        page.wait_for_selector(".agentloop-inbox-call")
        assert page.locator(".agentloop-inbox-call").count() == 3
        assert page.title() != "owned"
        assert MARKUP in page.locator(f"#inbox-call-{bob.pk} .agentloop-inbox-chat").inner_text()

        page.select_option("select[name=tool]", "transfer")
        page.click("#agentloop-inbox-filters input[type=submit]")
        page.wait_for_url("**tool=transfer**")
        assert page.locator(".agentloop-inbox-call").count() == 2
        screenshot(page, "admin-approval-inbox.png", tmp_path)

        # Invalid edited arguments: refused, nothing changed, the draft and the reason shown.
        row = page.locator(f"#inbox-call-{bob.pk}")
        row.locator("summary").click()
        row.locator("textarea[name=arguments]").fill('{"amount": "lots", "to": "bob"}')
        row.locator("button[value=approve_edited]").click()
        row = page.locator(f"#inbox-call-{bob.pk}")
        problem = row.locator(".agentloop-inbox-problem")
        problem.wait_for()
        assert "Invalid arguments for tool 'transfer'" in problem.inner_text()
        assert "Nothing was changed." in problem.inner_text()
        assert row.locator("textarea[name=arguments]").input_value() == (
            '{"amount": "lots", "to": "bob"}'
        )
        assert ToolCall.objects.get(pk=bob.pk).decision == ""

        # Fixed: approved with them; the call leaves the inbox.
        row.locator("textarea[name=arguments]").fill('{"amount": 50, "to": "bob"}')
        row.locator("button[value=approve_edited]").click()
        page.wait_for_selector(".messagelist .success")
        assert page.locator(f"#inbox-call-{bob.pk}").count() == 0
        assert "tool=transfer" in page.url  # back with the filters kept

        # Carol's is denied with a reason.
        row = page.locator(f"#inbox-call-{carol.pk}")
        row.locator("input[name=reason]").fill("not this month")
        row.locator("button[value=deny]").click()
        page.wait_for_selector(".agentloop-inbox-empty")

        page.click("text=Decided")
        page.wait_for_selector(".agentloop-inbox-decision")
        decisions = page.locator(".agentloop-inbox-decision").all_inner_texts()
        assert decisions[0].startswith("Denied by root at ")
        assert decisions[0].endswith(": not this month")
        assert decisions[1].startswith("Approved by root at ")
        assert page.title() != "owned"

    approved = ToolCall.objects.select_related("decided_by").get(pk=bob.pk)
    assert (approved.arguments, approved.original_arguments) == (
        {"amount": 50, "to": "bob"}, {"amount": 500, "to": "bob"},
    )  # fmt: skip
    assert approved.decided_by.username == "root"
    # The server sent the background chat on: the approved call ran with the edited arguments.
    chat = wait_until(
        lambda: Chat.objects.filter(pk=bob.chat_id, state=ChatState.IDLE, lease_token="").first(),
        "the approved chat to finish",
    )
    assert chat.messages.filter(role="tool").get().content == "sent 50 to bob"
