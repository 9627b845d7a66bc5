"""A React page using the AI SDK's ``useChat`` (frontends/usechat/, the ``ai`` and
``@ai-sdk/react`` packages pinned there) against agentloop's ``usechat`` views, in Chromium.

The page is built with node (``npm ci`` and ``npm run build``) when its build output is
missing or older than its sources; the output stays in the tree (git-ignored). uvicorn
serves it (ASGI) with the test settings plus the page (tests/usechat_site/); its chats
run in the server's embedded background threads on the "usechat" model
(tests/usechat_site/provider.py), and the page follows them through the UI message
stream: streamed text, a tool call, an approval given and one denied in the page, cancel (of
an answer, and of a call before it ran), and a reload in the middle of an answer.

Skipped when node, npm, Chromium or the ``playwright`` package is missing, except under
``CI=true``, where that fails the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentloop.models import Chat, Message, ToolCall
from tests.browsers import CHROMIUM, Server, free_port, log_in, open_tab
from tests.frontend_build import BUILT, build, node_missing
from tests.tools import add, transfer
from tests.usechat_site.provider import STORY

IN_CI = os.environ.get("CI") == "true"
SERVER_SETTINGS = {
    "BACKGROUND": "embedded",
    "PARTIAL_SAVE_INTERVAL": 0.1,
    "EVENTS_POLL_INTERVAL": 0.1,
}

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: the ORM between page actions (Chromium and node are checked below)
    pytest.mark.usefixtures("orm_next_to_playwright", "no_run_left_behind"),
]


def _missing() -> str | None:
    if reason := node_missing():
        return reason
    if not Path(CHROMIUM).exists():
        return f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module", autouse=True)
def _tools_available() -> None:
    reason = _missing()
    if reason and IN_CI:
        pytest.fail(f"{reason}; under CI=true the useChat browser tests must run")
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def frontend(_tools_available) -> Path:
    """The built page (npm ci from the lock file when node_modules is missing)."""
    return build() / BUILT.name


@pytest.fixture(scope="module")
def site(frontend, django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """uvicorn (ASGI) serving the test site with the React page."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    environment = {"DJANGO_SETTINGS_MODULE": "tests.usechat_site.settings"}
    with django_db_blocker.unblock():
        server = Server(
            command,
            port,
            tmp_path_factory.mktemp("usechat") / "server.log",
            SERVER_SETTINGS,
            environment,
        )
    yield server
    server.stop()


@pytest.fixture
def page(_tools_available, browser, site, person) -> Iterator[object]:
    with open_tab(browser) as tab:
        log_in(tab, site, "ada", "lovelace")
        yield tab


@pytest.fixture
def chat(person) -> Chat:
    chat = Chat.objects.create(owner=person, model="usechat:test")
    return chat.with_tools(add, transfer)  # stored by import path: the server imports them


def open_chat(page, site: Server, chat: Chat) -> None:
    from playwright.sync_api import expect

    page.goto(f"{site.url}/usechat/{chat.pk}/")
    expect(page.locator("#status")).to_have_text("ready")


def send(page, text: str) -> None:
    from playwright.sync_api import expect

    page.fill("textarea[name=text]", text)
    page.get_by_role("button", name="Send").click()
    expect(page.locator("li.msg-user .text").last).to_have_text(text)


def answer_text(page):
    return page.locator("li.msg-assistant").last.locator(".text").last


def lengths_as_it_grows(page, observations: int) -> list[int]:
    """The last answer's text length each time it grew, ``observations`` times."""
    lengths = [0]
    for _ in range(observations):
        page.wait_for_function(
            "(seen) => {"
            "  const texts = document.querySelectorAll('li.msg-assistant .text');"
            "  const node = texts[texts.length - 1];"
            "  return node !== undefined && node.textContent.length > seen;"
            "}",
            arg=lengths[-1],
        )
        lengths.append(len(answer_text(page).text_content()))
    return lengths[1:]


# -- the tests ----------------------------------------------------------------------------------
def test_an_answer_streams_into_the_page_word_by_word(page, site, chat):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "story")

    lengths = lengths_as_it_grows(page, observations=3)
    expect(answer_text(page)).to_have_text(STORY, timeout=60_000)
    expect(page.locator("#status")).to_have_text("ready")

    assert lengths == sorted(set(lengths)) and lengths[0] < len(STORY)
    assert Message.objects.get(chat=chat, role="assistant").content == STORY


def test_a_tool_call_shows_with_its_result_and_the_answer(page, site, chat):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "add")

    call = page.locator("li.msg-assistant .call.output-available")
    expect(call.locator(".tool")).to_have_text("add")
    expect(call.locator(".args")).to_have_text('{"a":2,"b":3}')
    expect(call.locator(".result")).to_have_text("5")
    expect(answer_text(page)).to_have_text("2 + 3 = 5.")


def test_approving_in_the_page_runs_the_call_and_the_chat_goes_on(page, site, chat, person):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "pay")
    waiting = page.locator(".call.approval-requested")
    expect(waiting.locator(".tool")).to_have_text("transfer")
    expect(page.locator("#status")).to_have_text("ready")

    waiting.get_by_role("button", name="Approve").click()

    expect(page.locator(".call.output-available .result")).to_have_text("sent 5 to bob")
    expect(answer_text(page)).to_have_text("Done: sent 5 to bob.")
    call = ToolCall.objects.get(chat=chat, name="transfer")
    assert (call.decision, call.decided_by_id) == ("approved", person.pk)
    page.reload()  # the history from the database shows the same
    expect(page.locator(".call.output-available .result")).to_have_text("sent 5 to bob")
    expect(answer_text(page)).to_have_text("Done: sent 5 to bob.")


def test_denying_in_the_page_shows_the_call_denied_with_the_reason(page, site, chat):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "pay")
    waiting = page.locator(".call.approval-requested")
    expect(waiting.locator(".tool")).to_have_text("transfer")

    waiting.get_by_role("button", name="Deny").click()

    expect(page.locator(".call.output-denied .result")).to_have_text("denied: No.")
    expect(page.locator("#status")).to_have_text("ready")
    assert ToolCall.objects.get(chat=chat, name="transfer").decision == "denied"
    page.reload()  # the history from the database shows the same
    expect(page.locator(".call.output-denied .result")).to_have_text("denied: No.")


def test_a_call_cancelled_before_it_ran_shows_cancelled(page, site, chat):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "pay")
    expect(page.locator(".call.approval-requested .tool")).to_have_text("transfer")

    assert Chat.objects.get(pk=chat.pk).cancel()  # from another tab, the admin, a shell
    page.reload()

    call = page.locator("li.msg-assistant.cancelled .call.cancelled")
    expect(call.locator(".tool")).to_have_text("transfer")
    expect(call.locator(".result")).to_have_text("cancelled")
    expect(page.locator(".call.approval-requested")).to_have_count(0)
    assert ToolCall.objects.get(chat=chat, name="transfer").state == "cancelled"


def test_cancel_stops_the_answer_and_the_page_shows_what_was_kept(page, site, chat):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "story")
    lengths_as_it_grows(page, observations=2)

    page.click("#cancel")

    expect(page.locator("li.msg-assistant.cancelled .marker")).to_have_text("cancelled")
    expect(page.locator("#status")).to_have_text("ready")
    kept = Message.objects.get(chat=chat, role="assistant", status="cancelled").content
    expect(answer_text(page)).to_have_text(kept)
    assert 0 < len(kept) < len(STORY) and STORY.startswith(kept)


def test_a_reload_in_the_middle_shows_the_history_and_the_rest_of_the_answer(page, site, chat):
    from playwright.sync_api import expect

    open_chat(page, site, chat)
    send(page, "add")
    expect(answer_text(page)).to_have_text("2 + 3 = 5.")
    send(page, "story")
    before = lengths_as_it_grows(page, observations=2)[-1]

    page.reload()

    # From the database: the first exchange, and the second question.
    expect(page.locator("li.msg-user .text")).to_have_text(["add", "story"])
    expect(page.locator(".call.output-available .result")).to_have_text("5")
    expect(page.locator("li.msg-assistant").first.locator(".text")).to_have_text("2 + 3 = 5.")
    # Then the answer in flight (only the resume stream has it), growing on to its end.
    expect(page.locator("li.msg-assistant")).to_have_count(2)
    expect(page.locator("#status")).to_have_text("streaming")
    after = lengths_as_it_grows(page, observations=2)
    expect(answer_text(page)).to_have_text(STORY, timeout=60_000)
    expect(page.locator("li.msg-assistant")).to_have_count(2)
    expect(page.locator("#status")).to_have_text("ready")
    assert before < len(STORY) and after[0] < len(STORY)
