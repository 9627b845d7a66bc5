"""Budgets and rate limits on the example site's chat page, in a real browser: a chat over its
owner's budget shows why it stopped, and a chat whose step waits for a rate limit shows what
it waits for. Each site is ``manage.py runserver`` with the settings of its test (the chats
run on the offline demo model in the server's embedded background threads)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentloop.models import Chat, ChatState
from tests.browsers import SERVER_SETTINGS, Server, log_in, runserver, start_chat

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: skip without Chromium/Playwright; the ORM between page actions
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright", "no_run_left_behind"),
]


def serve(settings: dict, django_db_blocker, tmp_path_factory, name: str) -> Server:
    with django_db_blocker.unblock():
        log = tmp_path_factory.mktemp(name) / "server.log"
        return runserver(log, {**SERVER_SETTINGS, **settings})


@pytest.fixture(scope="module")
def budget_site(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """The site with a budget no model call fits in: a token a day."""
    server = serve({"BUDGETS": {"tokens_per_day": 1}}, django_db_blocker, tmp_path_factory, "b")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def paced_site(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """The site with the demo model held to a request a minute (buckets in the database)."""
    pace = {"RATE_LIMITS": {"demo": {"requests_per_minute": 1}}, "RATE_LIMIT_WAIT": 0.1}
    server = serve(pace, django_db_blocker, tmp_path_factory, "r")
    yield server
    server.stop()


def test_a_chat_over_its_owners_budget_shows_why_it_stopped(page, budget_site, person):
    from playwright.sync_api import expect

    log_in(page, budget_site, "ada", "lovelace")
    chat_id = start_chat(page, "Hello")

    reason = f"budget: 1 token/day reached for owner {person.pk}"
    expect(page.locator("#error")).to_have_text(f"Stopped: {reason}")
    expect(page.locator("#state")).to_have_text("stopped")
    assert Chat.objects.get(pk=chat_id).stop_reason == reason


def test_a_chat_waiting_for_a_rate_limit_shows_what_it_waits_for(page, paced_site, person):
    from playwright.sync_api import expect

    log_in(page, paced_site, "ada", "lovelace")
    start_chat(page, "Hello")  # the minute's one request
    expect(page.locator("#state")).to_have_text("idle")
    page.goto(f"{paced_site.url}/")
    chat_id = start_chat(page, "Hello again")  # its step ends, to come back in a minute

    waiting = "waiting for rate limit: demo requests per minute"
    expect(page.locator("#state")).to_have_text(waiting)
    chat = Chat.objects.get(pk=chat_id)
    assert (chat.state, chat.waiting_for) == (ChatState.QUEUED, waiting[12:])
    # Not left for the next test: its job, back in a minute, finds it settled and skips it.
    Chat.objects.filter(pk=chat_id).update(state=ChatState.IDLE, retry_at=None)
