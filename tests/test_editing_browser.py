"""Edit and Regenerate on the example site's chat page, in a real browser (docs/editing.md).

Chromium (Playwright) against ``manage.py runserver`` on the test database (the ``site``
fixture of tests/conftest.py); the chats run on the offline demo model in the server's
embedded background threads, and the page follows them through agentloop's event stream.
Skipped without Chromium or Playwright, except under ``CI=true``.
"""

from __future__ import annotations

import pytest

from agentloop.models import Chat, Message
from tests.browsers import log_in, screenshot, send, start_chat

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright", "no_run_left_behind"),
]

ANSWER = "li.msg-assistant:not(.streaming) .text"


def shown(page) -> list[tuple[str, str]]:
    """The page's messages: role and text."""
    return [
        (
            item.get_attribute("class").split()[1].removeprefix("msg-"),
            item.locator(".text").text_content(),
        )
        for item in page.locator("#transcript > li.msg").all()
    ]


def wait_for_answer_after(page, key: int) -> None:
    """Until the page's last message is a finished answer saved after message ``key``."""
    page.wait_for_function(
        "(key) => {"
        "  const items = document.querySelectorAll('#transcript > li.msg');"
        "  const last = items[items.length - 1];"
        "  return last && last.matches('.msg-assistant:not(.streaming)')"
        "    && Number(last.dataset.id) > key && last.querySelector('.text').textContent;"
        "}",
        arg=key,
    )


def current_shown(chat_id: int) -> list[tuple[str, str]]:
    """The chat's current messages as the page shows them (tool results sit in their call)."""
    rows = Message.objects.filter(chat_id=chat_id).current().exclude(role__in=["system", "tool"])
    return list(rows.order_by("id").values_list("role", "content"))


def test_regenerate_replaces_the_last_answer_with_a_new_one(page, site, person):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, "What is 2 + 2?")
    expect(page.locator(ANSWER).last).to_have_text("2 + 2 = 4.")
    old = Message.objects.filter(chat_id=chat_id, role="assistant").last()
    expect(page.locator("#regenerate")).to_be_enabled()

    page.click("#regenerate")

    # The replaced rows leave the page; the calculator's call and the answer come again.
    expect(page.locator(f'li.msg[data-id="{old.pk}"]')).to_have_count(0)
    wait_for_answer_after(page, old.pk)
    expect(page.locator("li.call.done")).to_have_count(1)
    expect(page.locator(ANSWER)).to_have_count(2)
    expect(page.locator(ANSWER).last).to_have_text("2 + 2 = 4.")
    expect(page.locator("#state")).to_have_text("idle")
    new = Message.objects.filter(chat_id=chat_id, role="assistant").current().last()
    last = page.locator("li.msg-assistant").last
    assert last.get_attribute("data-id") == str(new.pk) != str(old.pk)
    assert shown(page) == current_shown(chat_id)
    assert [role for role, _ in shown(page)] == ["user", "assistant", "assistant"]
    assert Message.objects.filter(chat_id=chat_id).superseded().count() == 4


def test_edit_reruns_the_chat_from_the_edited_message(page, site, person, tmp_path):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, "What is 2 + 2?")
    expect(page.locator(ANSWER).last).to_have_text("2 + 2 = 4.")
    send(page, "What is 3 + 3?")
    expect(page.locator(ANSWER).last).to_have_text("3 + 3 = 6.")

    first = page.locator("li.msg-user").first
    first.get_by_role("button", name="Edit").click()
    box = first.locator(".editor textarea")
    expect(box).to_have_value("What is 2 + 2?")
    screenshot(page, "chat-editing.png", tmp_path)
    box.fill("What is 5 + 5?")
    last_before = Message.objects.filter(chat_id=chat_id).last()
    first.get_by_role("button", name="Save and answer").click()
    wait_for_answer_after(page, last_before.pk)

    expect(page.locator(ANSWER).last).to_have_text("5 + 5 = 10.")
    expect(page.locator("li.msg-user")).to_have_count(1)
    expect(page.locator(ANSWER)).to_have_count(2)
    expected = current_shown(chat_id)
    assert shown(page) == expected
    assert [expected[0], expected[-1]] == [("user", "What is 5 + 5?"), ("assistant", "5 + 5 = 10.")]
    assert Message.objects.filter(chat_id=chat_id).superseded().count() == 8

    page.reload()  # the server draws the same: superseded rows are not shown
    page.wait_for_selector("#chat[data-live='1']")
    assert shown(page) == expected


def test_an_edit_can_be_abandoned_and_the_message_is_shown_as_text(page, site, person):
    from playwright.sync_api import expect

    text = "<img src=x onerror=\"document.title='owned'\"> what can you do?"
    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, text)
    expect(page.locator(ANSWER).last).to_contain_text("offline demo model")

    first = page.locator("li.msg-user").first
    first.get_by_role("button", name="Edit").click()
    expect(first.locator(".editor textarea")).to_have_value(text)  # the text, not markup
    first.get_by_role("button", name="Discard").click()

    expect(first.locator(".editor")).to_have_count(0)
    expect(first.locator(".text")).to_have_text(text)
    assert page.locator("#transcript img").count() == 0
    assert page.title() != "owned"
    assert not Message.objects.filter(chat_id=chat_id).superseded().exists()


def test_editing_waits_while_an_answer_streams(page, site, person):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, "Tell me a story slowly")
    page.wait_for_selector("li.msg-assistant.streaming")

    expect(page.locator("#regenerate")).to_be_disabled()
    expect(page.locator("li.msg-user button.edit")).to_be_disabled()
    page.click("#cancel")
    expect(page.locator("#state")).to_have_text("idle")

    expect(page.locator("#regenerate")).to_be_enabled()
    expect(page.locator("li.msg-user button.edit")).to_be_enabled()
    assert Chat.objects.get(pk=chat_id).edited_at is None
