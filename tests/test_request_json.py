"""JSON people send (``agentloop.json_input``): every view that reads some refuses a body
nested too deeply or too large with a 400 and one line, and changes nothing. Before the bound,
a ``useChat`` body nested 100,000 levels deep raised ``RecursionError`` (a 500)."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from agentloop.json_input import JSONInputError, json_depth_exceeds, parse_json
from agentloop.models import Chat, ChatState, Message, ToolCall
from agentloop.testing import tool_call
from tests.tools import transfer

pytestmark = pytest.mark.django_db

DEEP = 100_000


def nested(levels: int, inner: str = "1") -> str:
    """``levels`` arrays inside each other around ``inner``."""
    return "[" * levels + inner + "]" * levels


@pytest.fixture
def waiting(user, scripted) -> ToolCall:
    """A call of the user's chat waiting for approval."""
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat.ask("Pay Bob")
    return ToolCall.objects.get(chat=chat)


def one_line_400(response) -> str:
    assert response.status_code == 400, response.content[:200]
    text = response.content.decode()
    assert "\n" not in text.strip() and len(text) < 200
    return text


def post_usechat(client: Client, payload: str | bytes):
    return client.post(reverse("agentloop:usechat"), payload, content_type="application/json")


def test_a_usechat_body_nested_100000_deep_is_a_400_and_nothing_is_written(owner, chat):
    part = {"type": "text", "text": "Hi", "extra": "X"}
    payload = json.dumps(
        {"id": str(chat.pk), "messages": [{"role": "user", "parts": [part]}]}
    ).replace('"X"', nested(DEEP))

    reason = one_line_400(post_usechat(owner, payload))

    assert reason == "The request: nested too deeply (at most 100 levels of JSON)."
    assert not Message.objects.filter(chat=chat).exists()
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE


def test_a_usechat_approval_whose_output_nests_too_deep_is_a_400(owner, waiting):
    answer = {"type": "tool-transfer", "toolCallId": "t1", "state": "output-available"}
    payload = json.dumps(
        {
            "id": str(waiting.chat_id),
            "trigger": "submit-message",
            "messages": [{"role": "assistant", "parts": [{**answer, "output": "X"}]}],
        }
    ).replace('"X"', nested(200, '"deep"'))

    one_line_400(post_usechat(owner, payload))

    waiting.refresh_from_db()
    assert (waiting.state, waiting.decision) == ("waiting", "")


def test_a_usechat_body_over_json_max_bytes_is_a_400(owner, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "JSON_MAX_BYTES": 1000}
    payload = json.dumps(
        {
            "id": str(chat.pk),
            "messages": [{"role": "user", "parts": [{"type": "text", "text": "x" * 2000}]}],
        }
    )

    reason = one_line_400(post_usechat(owner, payload))

    assert reason.startswith("The request: too large (") and "at most 1000" in reason
    assert not Message.objects.filter(chat=chat).exists()


def test_a_body_over_djangos_upload_limit_is_the_same_one_line_400(owner, chat, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    payload = json.dumps({"id": str(chat.pk), "messages": [], "padding": "x" * 2000})

    reason = one_line_400(post_usechat(owner, payload))

    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in reason


def test_a_body_within_the_bounds_is_read_as_before(owner, chat):
    part = {"type": "text", "text": "Hi", "extra": json.loads(nested(90))}
    payload = json.dumps(
        {
            "id": str(chat.pk),
            "trigger": "regenerate",
            "messages": [{"role": "user", "parts": [part]}],
        }
    )

    # Read whole: the refusal is about what it asks, not about its JSON.
    assert one_line_400(post_usechat(owner, payload)) == (
        "Only new messages and approvals are taken here."
    )


def test_approve_view_refuses_edited_arguments_nested_too_deep(owner, waiting):
    url = reverse("agentloop:approve", args=[waiting.chat_id, waiting.pk])

    reason = one_line_400(owner.post(url, {"arguments": '{"to": ' + nested(DEEP) + "}"}))

    assert reason == "arguments: nested too deeply (at most 100 levels of JSON)."
    waiting.refresh_from_db()
    assert (waiting.state, waiting.decision, waiting.original_arguments) == ("waiting", "", None)


def test_the_admin_inbox_refuses_edited_arguments_nested_too_deep(admin_client, waiting):
    url = reverse("admin:agentloop_chat_inbox_decide", args=[waiting.pk])
    response = admin_client.post(
        url, {"decision": "approve_edited", "arguments": '{"to": ' + nested(DEEP) + "}"}
    )

    assert response.status_code == 400
    assert "The arguments: nested too deeply (at most 100 levels of JSON)." in (
        response.content.decode()
    )
    waiting.refresh_from_db()
    assert (waiting.state, waiting.decision) == ("waiting", "")


@pytest.mark.parametrize(
    ("text", "deeper_than_2"),
    [
        ("[[1]]", False),
        ("[[[1]]]", True),
        ('["[[[[", {"a": "]]]{{{"}]', False),  # brackets in strings nest nothing
        ('[["\\"[[["]]', False),  # nor after an escaped quote
        ('{"a": {"b": {"c": 1}}}', True),
    ],
)
def test_depth_counts_only_brackets_outside_strings(text, deeper_than_2):
    assert json_depth_exceeds(text, 2) is deeper_than_2


def test_parse_json_names_what_it_read_in_one_line():
    with pytest.raises(JSONInputError, match=r"^The body must be JSON\.$"):
        parse_json(b'{"a": ', "The body")
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}


@pytest.mark.parametrize(("model", "field"), [(Chat, "tools"), (ToolCall, "arguments")])
def test_the_admins_json_fields_refuse_json_nested_too_deep_with_a_form_error(
    rf, admin_user, waiting, model, field
):
    from django.contrib import admin

    row = waiting.chat if model is Chat else waiting
    request = rf.post("/")
    request.user = admin_user
    model_admin = admin.site._registry[model]
    form_class = model_admin.get_form(request, row)
    initial = form_class(instance=row).initial  # the form as the change page shows it
    data = {
        key: json.dumps(value) if isinstance(value, dict | list) else value
        for key, value in initial.items()
        if value is not None
    }
    data[field] = nested(DEEP)

    form = form_class(data, instance=row)

    assert not form.is_valid()
    assert form.errors[field] == ["This JSON: nested too deeply (at most 100 levels of JSON)."]
    assert "[[[" in form[field].value()  # shown again as typed
