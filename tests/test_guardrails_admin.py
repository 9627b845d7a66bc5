"""What guardrails decided, as the admin shows it (the chat timeline, the "went wrong" filter)
and as pages get it (live events and the useChat history leave a blocked answer's text out)."""

from __future__ import annotations

import html

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentloop.exceptions import GuardrailBlockedError
from agentloop.guardrails import Block, input_guardrail
from agentloop.live_events import message_payload
from agentloop.models import Chat
from agentloop.testing import tool_call
from agentloop.web import ui_messages
from tests import guardrail_checks as checks
from tests.tools import add, charge_card

pytestmark = pytest.mark.django_db

#: the change page's statements (tests/test_admin.py counts them out): outcomes ride on the
#: message and tool-call rows it reads anyway.
CHANGE_PAGE_QUERIES = 7


@pytest.fixture
def chat(user, scripted):
    return Chat.objects.create(model="scripted:test", owner=user)


def page(client, chat) -> str:
    response = client.get(reverse("admin:agentloop_chat_change", args=[chat.pk]))
    assert response.status_code == 200
    return response.content.decode()


@input_guardrail
def markup(context):
    """Blocks with a reason that holds markup (guardrail text is shown escaped)."""
    return Block("<script>alert(1)</script> is not allowed")


def test_the_timeline_shows_each_guardrails_decision_on_its_message(admin_client, chat, scripted):
    chat.with_guardrails(checks.redact_cards, checks.no_leaks)
    scripted.add("the LEAK")
    with pytest.raises(GuardrailBlockedError):
        chat.ask("card 4242 4242 4242 4242")

    content = page(admin_client, chat)

    assert "blocked by a guardrail: kept for the record; the model does not see it" in content
    assert "<code>redact_cards</code>" in content
    assert ">replaced</span>" in content
    assert "card 4242 4242 4242 4242" in content  # what it replaced, for the record
    assert "<code>no_leaks</code>" in content
    assert "the answer leaks internal data" in content
    assert "Stopped: guardrail no_leaks: the answer leaks internal data" in html.unescape(content)


def test_the_timeline_shows_a_tool_calls_guardrail_outcome(admin_client, chat, scripted):
    chat.with_guardrails(checks.cap_charges).with_tools(charge_card)
    scripted.add(tool_call("charge_card", {"amount": 90}), "no")
    chat.ask("charge")

    content = page(admin_client, chat)

    assert "<code>cap_charges</code>" in content
    assert "charges over 40 need a person" in content


def test_guardrail_text_is_escaped_on_the_timeline(admin_client, chat):
    chat.with_guardrails(markup)
    with pytest.raises(GuardrailBlockedError):
        chat.ask("Hi")

    content = page(admin_client, chat)

    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt; is not allowed" in content


def test_outcomes_cost_the_change_page_no_query(admin_client, admin_user, chat, scripted):
    chat.with_guardrails(checks.no_secrets, checks.cap_charges).with_tools(charge_card, add)
    scripted.add(tool_call("charge_card", {"amount": 90}), "ok")
    chat.ask("charge")
    page(admin_client, chat)  # warm the per-process content type cache

    with CaptureQueriesContext(connection) as queries:
        page(admin_client, chat)

    assert len(queries) == CHANGE_PAGE_QUERIES


def test_the_went_wrong_filter_finds_chats_a_guardrail_blocked(admin_client, user, scripted):
    blocked_input = Chat.objects.create(model="scripted:test", owner=user, title="input")
    blocked_input.with_guardrails(checks.no_secrets)
    with pytest.raises(GuardrailBlockedError):
        blocked_input.ask("secret")
    blocked_tool = Chat.objects.create(model="scripted:test", owner=user, title="tool")
    blocked_tool.with_guardrails(checks.cap_charges).with_tools(charge_card)
    scripted.add(tool_call("charge_card", {"amount": 90}), "no", "fine")
    blocked_tool.ask("charge")
    fine = Chat.objects.create(model="scripted:test", owner=user, title="fine")
    fine.with_guardrails(checks.no_secrets)
    fine.ask("hello")

    response = admin_client.get("/admin/agentloop/chat/?problem=blocked")

    assert response.status_code == 200
    shown = {chat.title for chat in response.context["cl"].result_list}
    assert shown == {"input", "tool"}


def test_pages_never_get_a_blocked_answers_text(chat, scripted):
    chat.with_guardrails(checks.no_leaks)
    scripted.add("the LEAK")
    with pytest.raises(GuardrailBlockedError):
        chat.ask("Tell me")
    answer = chat.messages.get(role="assistant")

    payload = message_payload(answer)
    assert (payload["content"], payload["status"]) == ("", "blocked")
    assert payload["blocked"] == "guardrail no_leaks: the answer leaks internal data"
    history = ui_messages(chat)
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[1]["parts"] == []
    assert history[1]["metadata"] == {
        "blocked": "guardrail no_leaks: the answer leaks internal data"
    }
    assert "LEAK" not in str(history)
