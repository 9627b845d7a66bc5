"""The example site without a browser: its pages and views, its demo agent, ``demo_site``.

The live page itself is driven in a real browser by tests/test_browser.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission
from django.test import AsyncClient, Client
from django.urls import reverse

from agentloop.django_store.leases import Lease
from agentloop.live_events import message_payload
from agentloop.messages import Message, ModelRequest, ToolCall
from agentloop.models import Chat
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import reply
from agentloop.tools import AskPerson
from example_project.demo.agents import Assistant
from example_project.demo.provider import CITY_QUESTION, STORY, RuleBasedProvider, plan_tool_calls
from example_project.demo.tools import DeleteNotes, ListNotes, Weather
from example_project.models import Note
from tests.processes import REPO_ROOT, process_env

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_model(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "DEFAULT_MODEL": "demo:rule-based"}


@pytest.fixture
def chat(user, demo_model):
    return Assistant.create(owner=user)


def someone(django_user_model, username="eve", **fields) -> Client:
    person = django_user_model.objects.create_user(username=username, **fields)
    client = Client()
    client.force_login(person)
    return client


# -- the demo agent ----------------------------------------------------------------------------
def test_the_assistant_offers_the_demo_tools_a_question_and_the_researcher(demo_model):
    chat = Assistant.chat()

    assert sorted(chat.tools()) == [
        "ask_person", "calculator", "delete_notes", "list_notes", "researcher", "save_note",
        "weather",
    ]  # fmt: skip


def test_delete_notes_waits_for_approval():
    assert DeleteNotes.requires_approval is True


def test_the_assistant_hands_research_to_the_researcher_subagent(user, demo_model):
    chat = Assistant.create(owner=user)

    answer = chat.ask("Research the weather in Oslo")

    child = Chat.objects.get(parent=chat)
    assert child.agent_path.endswith("Researcher") and child.owner == user
    assert [c.name for c in child.tool_calls.all()] == ["weather"]
    assert answer.content.startswith("The researcher reports: In Oslo it is")


# -- the rule-based model's new rules ----------------------------------------------------------
def request_for(*messages: Message, tools=(Weather, ListNotes, DeleteNotes, AskPerson), **options):
    return ModelRequest(
        model="rule-based",
        messages=list(messages),
        tools=[tool.definition() for tool in tools],
        **options,
    )


def test_plan_deletes_notes_without_listing_them():
    assert plan_tool_calls("Please delete my notes.") == [("delete_notes", {})]


def test_plan_asks_the_person_for_a_city():
    assert plan_tool_calls("Ask me where to go") == [("ask_person", {"question": CITY_QUESTION})]


def test_plan_gives_research_to_the_researcher_when_offered():
    text = "Research the weather in Oslo"

    assert plan_tool_calls(text, {"researcher", "weather"}) == [("researcher", {"task": text})]
    assert plan_tool_calls(text, {"weather"}) == [("weather", {"city": "Oslo"})]


def test_a_slow_request_streams_the_story_word_by_word():
    chunks = []

    response = RuleBasedProvider(slow_delay=0.0).request(
        request_for(Message(role="user", content="Tell me a story slowly"), stream=True),
        on_chunk=chunks.append,
    )

    assert response.content == STORY
    assert len(chunks) == len(STORY.split(" "))


def test_the_answer_to_which_city_is_followed_by_its_weather():
    ask = ToolCall(id="demo_1", name="ask_person", arguments={"question": CITY_QUESTION})
    transcript = [
        Message(role="user", content="Ask me where to go"),
        Message(role="assistant", tool_calls=[ask]),
        Message(role="tool", content="Lisbon", tool_call_id="demo_1"),
    ]

    response = RuleBasedProvider().request(request_for(*transcript))

    assert [(c.name, c.arguments) for c in response.tool_calls] == [("weather", {"city": "Lisbon"})]


# -- pages -------------------------------------------------------------------------------------
def test_the_chat_list_needs_a_login(client, settings):
    response = client.get(reverse("chat_list"))

    assert response.status_code == 302
    assert response["Location"].startswith(settings.LOGIN_URL)


def test_the_chat_list_shows_my_chats_and_not_others_or_subagents(owner, user, django_user_model):
    mine = Chat.objects.create(owner=user, title="Mine")
    Chat.objects.create(owner=user, title="A subagent's", parent=mine)
    Chat.objects.create(owner=django_user_model.objects.create_user("eve"), title="Not mine")

    response = owner.get(reverse("chat_list"))

    assert [chat.title for chat in response.context["chats"]] == ["Mine"]


@pytest.mark.django_db(transaction=True)
def test_a_new_chat_with_a_first_message_is_answered_in_the_background(owner, user, demo_model):
    response = owner.post(reverse("chat_new"), {"text": "What is 6 * 7?"})
    wait_for_embedded_jobs(30)

    chat = Chat.objects.get(owner=user)
    assert response["Location"] == reverse("chat_detail", args=[chat.pk])
    assert chat.title == "What is 6 * 7?"
    assert chat.agent_path.endswith("Assistant")
    assert chat.messages.last().content == "6 * 7 = 42."


def test_the_chat_page_shows_the_transcript_with_results_inside_their_calls(owner, chat):
    chat.ask("What is 6 * 7?")

    response = owner.get(reverse("chat_detail", args=[chat.pk]))

    [user_turn, asking, answer] = response.context["transcript"]
    assert user_turn["message"].content == "What is 6 * 7?"
    [call] = asking["calls"]
    assert (call["call"].name, call["arguments"], call["result"].content) == (
        "calculator",
        '{"expression":"6 * 7"}',
        "42",
    )
    assert answer["message"].content == "6 * 7 = 42."
    assert response.context["position"] == str(chat.messages.order_by("id").last().pk)
    assert response.context["can_send"] is True


def test_the_chat_page_shows_thinking_collapsed_and_escaped(owner, user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(reply("Paris.", thinking="The capital is <b>Paris</b>."))
    chat.ask("Capital of France?")

    page = owner.get(reverse("chat_detail", args=[chat.pk])).content.decode()

    assert '<details class="thinking"><summary>Thinking</summary>' in page
    assert "The capital is &lt;b&gt;Paris&lt;/b&gt;." in page
    answer = chat.messages.get(role="assistant")
    assert message_payload(answer)["thinking"] == "The capital is <b>Paris</b>."


def test_another_user_gets_404_for_the_chat_page(django_user_model, chat):
    stranger = someone(django_user_model)

    assert stranger.get(reverse("chat_detail", args=[chat.pk])).status_code == 404


def test_staff_allowed_to_view_chats_see_the_page_but_cannot_send(django_user_model, chat):
    staff = someone(django_user_model, "sam", is_staff=True)
    person = django_user_model.objects.get(username="sam")
    person.user_permissions.add(
        Permission.objects.get(codename="view_chat", content_type__app_label="agentloop")
    )

    page = staff.get(reverse("chat_detail", args=[chat.pk]))
    sent = staff.post(reverse("chat_send", args=[chat.pk]), {"text": "Hi"})

    assert page.status_code == 200 and page.context["can_send"] is False
    assert sent.status_code == 404


# -- sending -----------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_sending_adds_the_message_and_answers_it_in_the_background(owner, chat):
    response = owner.post(reverse("chat_send", args=[chat.pk]), {"text": "What is 2 + 2?"})
    wait_for_embedded_jobs(30)

    assert response.status_code == 204
    assert [m.content for m in chat.messages.filter(role="user")] == ["What is 2 + 2?"]
    assert chat.messages.last().content == "2 + 2 = 4."


@pytest.mark.django_db(transaction=True)
def test_the_async_send_view_answers_under_the_asgi_handler(user, django_user_model, chat):
    """The send view is ``async def``: Django's AsyncClient runs it through the ASGI handler
    (the phases run on the request's own thread: committed rows, hence transaction=True)."""
    stranger = django_user_model.objects.create_user(username="eve")
    url = reverse("chat_send", args=[chat.pk])

    async def requests() -> list[Any]:
        owner, other = AsyncClient(), AsyncClient(enforce_csrf_checks=True)
        await owner.aforce_login(user)
        await other.aforce_login(stranger)
        return [
            await owner.post(url, {"text": "What is 2 + 2?"}),
            await owner.get(url),
            await _as(stranger, url),
            await other.post(url, {"text": "Hi"}),
        ]

    sent, got, strangers, without_csrf = async_to_sync(requests)()
    wait_for_embedded_jobs(30)

    assert (sent.status_code, got.status_code) == (204, 405)
    assert (strangers.status_code, without_csrf.status_code) == (404, 403)
    assert [m.content for m in chat.messages.filter(role="user")] == ["What is 2 + 2?"]
    assert chat.messages.last().content == "2 + 2 = 4."


async def _as(person: Any, url: str) -> Any:
    client = AsyncClient()
    await client.aforce_login(person)
    return await client.post(url, {"text": "Hi"})


def test_a_message_sent_while_the_assistant_answers_is_queued_for_after_it(owner, chat):
    held = Lease.take(Chat, chat.pk)  # a worker's job streams the answer

    response = owner.post(reverse("chat_send", args=[chat.pk]), {"text": "Hello?"})

    assert response.status_code == 204
    assert not chat.messages.filter(role="user").exists()  # nothing written into the run
    chat.refresh_from_db()
    assert [item["content"] for item in chat.inbox] == ["Hello?"]
    assert held.release(state="running")


def test_sending_is_refused_while_a_call_waits_for_approval(owner, chat):
    Note.objects.create(owner=chat.owner, text="Keep me")
    chat.ask("Delete my notes")

    response = owner.post(reverse("chat_send", args=[chat.pk]), {"text": "Hello?"})

    assert response.status_code == 409
    assert "Decide on the waiting tool calls first." in response.content.decode()


def test_an_empty_message_is_refused(owner, chat):
    assert owner.post(reverse("chat_send", args=[chat.pk]), {"text": "  "}).status_code == 400


def test_another_user_cannot_send_to_my_chat(django_user_model, chat):
    stranger = someone(django_user_model)

    assert stranger.post(reverse("chat_send", args=[chat.pk]), {"text": "Hi"}).status_code == 404
    assert not chat.messages.filter(role="user").exists()


def test_sending_needs_the_csrf_token(user, chat):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    assert client.post(reverse("chat_send", args=[chat.pk]), {"text": "Hi"}).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_an_html_form_is_sent_back_to_the_chat_page(owner, chat):
    response = owner.post(
        reverse("chat_send", args=[chat.pk]), {"text": "Hi"}, HTTP_ACCEPT="text/html"
    )
    wait_for_embedded_jobs(30)

    assert response.status_code == 302
    assert response["Location"] == reverse("chat_detail", args=[chat.pk])


# -- manage.py demo_site -----------------------------------------------------------------------
@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_demo_site_makes_the_demo_login_and_serves_the_site(django_user_model, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "demo_site.log"
    with log.open("w") as output:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter
            [sys.executable, "manage.py", "demo_site", "--port", str(port), "--no-input"],
            env=process_env(),
            cwd=REPO_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "log in as" not in log.read_text() or not _listening(port):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        import httpx

        page = httpx.get(f"http://localhost:{port}/accounts/login/", timeout=30)
    finally:
        process.terminate()
        process.wait(timeout=30)

    assert f"http://127.0.0.1:{port}/  (log in as demo / demo)" in log.read_text()
    assert page.status_code == 200
    assert django_user_model.objects.get(username="demo").check_password("demo")


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True
