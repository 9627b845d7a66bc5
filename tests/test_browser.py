"""The example site's live chat page in a real browser (docs/design.md §9).

Playwright drives Debian's Chromium (``/usr/bin/chromium``) against the example site
served by a real server process (``manage.py runserver``, threaded WSGI; one test uses
uvicorn, ASGI, and one Redis for the events) on the test database. The site's chats run
on the offline demo model in the server's embedded background threads; the page follows
them through agentloop's event stream.

Skipped when Chromium or the ``playwright`` package is missing, except under
``CI=true``, where that fails the run. With ``AGENTLOOP_SCREENSHOTS=1`` the
screenshots the documentation shows are written to ``docs/images/``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from agentloop.models import Chat, Message
from example_project.demo.provider import STORY
from example_project.models import Note
from tests.browsers import (
    IN_CI,
    SERVER_SETTINGS,
    Server,
    free_port,
    log_in,
    runserver,
    screenshot,
    send,
    start_chat,
)
from tests.redis_urls import redis_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: skip without Chromium/Playwright; the ORM between page actions
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright", "no_run_left_behind"),
]


# -- the servers (``site`` is tests/conftest.py's) -------------------------------------------
@pytest.fixture(scope="module")
def asgi_site(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """The same site under uvicorn (ASGI): event streams hold no thread."""
    pytest.importorskip("uvicorn", reason="uvicorn is a dev dependency (pip install -e '.[dev]')")
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    with django_db_blocker.unblock():
        server = Server(command, port, tmp_path_factory.mktemp("uvicorn") / "server.log")
    yield server
    server.stop()


# Streams are named by chat pk, which restarts at 1 in every test database: a Redis database
# per test process keeps runs side by side apart (the Celery tests use 15).
REDIS_URL = redis_url(1 + os.getpid() % 14)


@pytest.fixture(scope="module")
def redis_site(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """runserver again, with live events (and cancel notices) through Redis."""
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - the redis extra is a dev dependency
        unavailable(f"{exc.name} is not installed (pip install -e '.[redis]')")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        unavailable(f"Redis does not answer at {REDIS_URL}: {exc}")
    with django_db_blocker.unblock():
        server = runserver(
            tmp_path_factory.mktemp("redis") / "server.log",
            {**SERVER_SETTINGS, "REDIS_URL": REDIS_URL},
        )
    yield server
    server.stop()
    client.flushdb()
    client.close()


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}; under CI=true the browser tests with Redis must run")
    pytest.skip(f"{reason} (start it with: bash scripts/services.sh start)")


# -- the browser -------------------------------------------------------------------------------


def last_answer(page):
    return page.locator("li.msg-assistant:not(.streaming) .text").last


def text_lengths_as_it_grows(page, selector: str, observations: int) -> list[int]:
    """The length of the element's text each time it grew, ``observations`` times."""
    lengths = [0]
    for _ in range(observations):
        page.wait_for_function(
            "([selector, seen]) => {"
            "  const node = document.querySelector(selector);"
            "  return node !== null && node.textContent.length > seen;"
            "}",
            arg=[selector, lengths[-1]],
        )
        lengths.append(len(page.locator(selector).text_content()))
    return lengths[1:]


STREAMING_TEXT = "li.msg-assistant.streaming .text"


# -- streaming ---------------------------------------------------------------------------------
def test_a_sent_message_streams_in_and_the_answer_grows(page, site, person, tmp_path):
    log_in(page, site, "ada", "lovelace")
    start_chat(page, "Tell me a story slowly")

    lengths = text_lengths_as_it_grows(page, STREAMING_TEXT, observations=3)
    shown = page.locator(STREAMING_TEXT).text_content()
    screenshot(page, "chat-streaming.png", tmp_path)

    assert lengths == sorted(set(lengths))  # three times longer than before
    assert STORY.startswith(shown)


def test_the_answer_of_a_quick_question_replaces_the_streamed_text(page, site, person):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, "What is (12 + 30) * 2, and the weather in Paris and Tokyo?")

    expect(last_answer(page)).to_contain_text("(12 + 30) * 2 = 84. In Paris it is")
    calls = page.locator("li.call.done")
    expect(calls).to_have_count(3)
    assert calls.locator(".tool").all_text_contents() == ["calculator", "weather", "weather"]
    expect(calls.first.locator(".result")).to_have_text("84")
    answer = Message.objects.filter(chat_id=chat_id, role="assistant").last()
    assert last_answer(page).text_content() == answer.content


def test_a_message_typed_while_an_answer_streams_is_answered_after_it(page, site, person):
    """Double-texting: Send stays enabled while the answer streams; the second message is
    queued, then answered after the first answer, in order."""
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, "Tell me a story slowly")
    text_lengths_as_it_grows(page, STREAMING_TEXT, observations=1)

    button = page.locator("#send button[type=submit]")
    expect(button).to_be_enabled()  # while the story still streams
    page.fill("#send textarea", "What is 2 + 2?")
    button.click()

    expect(last_answer(page)).to_have_text("2 + 2 = 4.", timeout=60_000)
    rows = list(
        Message.objects.filter(chat_id=chat_id)
        .exclude(role="system")
        .order_by("id")
        .values_list("role", "content")
    )
    # The story first, whole; then the second question and its answer (via the calculator).
    assert [role for role, _ in rows[:3]] == ["user", "assistant", "user"]
    assert rows[1][1] == STORY and rows[2][1] == "What is 2 + 2?"
    assert rows[-1] == ("assistant", "2 + 2 = 4.")


# -- cancel ------------------------------------------------------------------------------------
def test_cancel_stops_a_slow_answer_and_the_chat_takes_a_new_message(page, site, person, tmp_path):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    chat_id = start_chat(page, "Tell me a story slowly")
    text_lengths_as_it_grows(page, STREAMING_TEXT, observations=2)

    page.click("#cancel")
    cancelled = page.locator("li.msg-assistant.cancelled")
    expect(cancelled.locator(".marker")).to_have_text("cancelled")
    expect(page.locator("#state")).to_have_text("idle")
    kept = Message.objects.get(chat_id=chat_id, status="cancelled")
    shown = cancelled.locator(".text").text_content()
    send(page, "What is 2 + 2?")
    expect(last_answer(page)).to_have_text("2 + 2 = 4.")
    screenshot(page, "chat-cancelled.png", tmp_path)

    assert shown == kept.content  # the page shows what was kept when it stopped...
    assert 0 < len(shown) < len(STORY) and STORY.startswith(shown)
    assert cancelled.locator(".text").text_content() == shown  # ...and it grew no more


# -- people in the loop ------------------------------------------------------------------------
def test_approving_a_call_runs_it_and_shows_its_result(page, site, person, tmp_path):
    from playwright.sync_api import expect

    Note.objects.create(owner=person, text="Pack an umbrella")
    Note.objects.create(owner=person, text="Buy stamps")
    log_in(page, site, "ada", "lovelace")
    start_chat(page, "Delete my notes")

    approval = page.locator(".decision.approval")
    expect(approval).to_contain_text("The assistant wants to run delete_notes")
    expect(page.locator("#state")).to_have_text("waiting")
    expect(page.locator("#send button[type=submit]")).to_be_disabled()
    screenshot(page, "chat-approval.png", tmp_path)
    approval.get_by_role("button", name="Approve").click()

    expect(page.locator("li.call.done .result")).to_have_text("Deleted 2 notes.")
    expect(last_answer(page)).to_have_text("Done: Deleted 2 notes.")
    expect(approval).to_have_count(0)
    assert not Note.objects.filter(owner=person).exists()


def test_cancelling_a_chat_waiting_for_approval_answers_the_call_as_cancelled(page, site, person):
    from playwright.sync_api import expect

    Note.objects.create(owner=person, text="Pack an umbrella")
    log_in(page, site, "ada", "lovelace")
    start_chat(page, "Delete my notes")
    approval = page.locator(".decision.approval")
    expect(approval).to_contain_text("The assistant wants to run delete_notes")
    expect(page.locator("#state")).to_have_text("waiting")

    page.click("#cancel")

    expect(page.locator("li.call.failed .result")).to_have_text(
        "Cancelled by the user before this tool ran."
    )
    expect(page.locator("#state")).to_have_text("idle")
    expect(approval).to_have_count(0)
    expect(page.locator("#send button[type=submit]")).to_be_enabled()
    assert Note.objects.filter(owner=person).count() == 1


def test_denying_a_call_gives_the_model_an_error_result_and_runs_nothing(page, site, person):
    from playwright.sync_api import expect

    Note.objects.create(owner=person, text="Pack an umbrella")
    log_in(page, site, "ada", "lovelace")
    start_chat(page, "Delete my notes")

    approval = page.locator(".decision.approval")
    approval.locator("input[name=reason]").fill("I still need them")
    approval.get_by_role("button", name="Deny").click()

    result = page.locator("li.call.failed .result")
    expect(result).to_contain_text("denied")
    expect(last_answer(page)).to_contain_text("The delete_notes tool reported a problem")
    assert Note.objects.filter(owner=person).count() == 1


def test_answering_a_question_continues_the_run(page, site, person):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    start_chat(page, "Ask me where to go")

    question = page.locator(".decision.question")
    expect(question).to_contain_text("Which city should I look up the weather for?")
    question.locator("input[name=text]").fill("Lisbon")
    question.get_by_role("button", name="Answer").click()

    expect(last_answer(page)).to_contain_text("You answered: Lisbon. In Lisbon it is")


def test_a_subagents_work_shows_as_a_call_and_links_to_its_chat(page, site, person):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    start_chat(page, "Research the weather in Oslo")
    expect(last_answer(page)).to_contain_text("The researcher reports: In Oslo it is")
    page.reload()

    call = page.locator("li.call.done", has=page.locator(".tool", has_text="researcher"))
    expect(call.locator(".result")).to_contain_text("In Oslo it is")
    call.get_by_role("link", name="Open the subagent's chat").click()

    expect(page.locator("li.call.done .tool")).to_have_text("weather")
    expect(page.locator("a.back")).to_contain_text("the chat that asked this subagent")


# -- reloading ---------------------------------------------------------------------------------
TRANSCRIPT_JS = """() => [...document.querySelectorAll('#transcript > li.msg')].map((item) => [
    item.className.replace(' streaming', ''),
    item.querySelector('.text').textContent,
    [...item.querySelectorAll('li.call')].map((call) => [
        call.className,
        call.querySelector('.tool').textContent,
        call.querySelector('.args').textContent,
        call.querySelector('.result').textContent,
    ]),
])"""


def test_a_reloaded_page_shows_the_transcript_the_live_page_drew(page, site, person, tmp_path):
    from playwright.sync_api import expect

    log_in(page, site, "ada", "lovelace")
    start_chat(page, "What is (12 + 30) * 2, and the weather in Paris and Tokyo?")
    expect(last_answer(page)).to_contain_text("In Tokyo it is")
    send(page, "Research the weather in Oslo and Rome")
    expect(last_answer(page)).to_contain_text("The researcher reports")
    send(page, "Ask me where to go")
    page.locator(".decision.question input[name=text]").fill("Lisbon")
    page.locator(".decision.question").get_by_role("button", name="Answer").click()
    expect(last_answer(page)).to_contain_text("You answered: Lisbon.")
    expect(page.locator("#state")).to_have_text("idle")
    live = page.evaluate(TRANSCRIPT_JS)

    page.reload()
    page.wait_for_selector("#chat[data-live='1']")
    expect(page.locator("#state")).to_have_text("idle")
    screenshot(page, "chat-page.png", tmp_path)

    assert page.evaluate(TRANSCRIPT_JS) == live
    assert [item[0] for item in live].count("msg msg-user") == 3


# -- access ------------------------------------------------------------------------------------
def test_another_user_gets_404_for_the_chat_page(page, site, person, django_user_model):
    chat = Chat.objects.create(owner=person, title="Private")
    django_user_model.objects.create_user(username="eve", password="eavesdrop")
    log_in(page, site, "eve", "eavesdrop")

    response = page.goto(f"{site.url}/chats/{chat.pk}/")
    events = page.request.get(f"{site.url}/agentloop/chats/{chat.pk}/events/")

    assert response.status == 404
    assert events.status == 404


def test_the_chat_list_shows_only_my_chats(page, site, person, django_user_model):
    from playwright.sync_api import expect

    other = django_user_model.objects.create_user(username="eve", password="eavesdrop")
    Chat.objects.create(owner=person, title="Mine")
    Chat.objects.create(owner=other, title="Not mine")
    log_in(page, site, "ada", "lovelace")

    expect(page.locator(".chat-list a")).to_have_text(["Mine"])


# -- ASGI --------------------------------------------------------------------------------------
def test_under_uvicorn_an_answer_streams_in_and_cancel_stops_it(page, asgi_site, person):
    from playwright.sync_api import expect

    log_in(page, asgi_site, "ada", "lovelace")
    chat_id = start_chat(page, "Tell me a story slowly")
    lengths = text_lengths_as_it_grows(page, STREAMING_TEXT, observations=2)

    page.click("#cancel")
    cancelled = page.locator("li.msg-assistant.cancelled .text")
    expect(page.locator("li.msg-assistant.cancelled .marker")).to_have_text("cancelled")

    assert lengths == sorted(set(lengths))
    expect(cancelled).to_have_text(Message.objects.get(chat_id=chat_id, status="cancelled").content)


# -- Redis ------------------------------------------------------------------------------------
def test_with_redis_the_answer_streams_chunk_by_chunk_and_cancel_marks_it(page, redis_site, person):
    from playwright.sync_api import expect

    log_in(page, redis_site, "ada", "lovelace")
    chat_id = start_chat(page, "Tell me a story slowly")
    lengths = text_lengths_as_it_grows(page, STREAMING_TEXT, observations=3)

    page.click("#cancel")
    cancelled = page.locator("li.msg-assistant.cancelled .text")
    expect(page.locator("li.msg-assistant.cancelled .marker")).to_have_text("cancelled")

    assert lengths == sorted(set(lengths))
    kept = Message.objects.get(chat_id=chat_id, status="cancelled")
    expect(cancelled).to_have_text(kept.content)  # the chunks gave way to the saved row
    send(page, "What is 2 + 2?")
    expect(last_answer(page)).to_have_text("2 + 2 = 4.")
