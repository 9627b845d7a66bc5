"""What arrives from outside, at its worst (DESIGN.md section 27), as properties (hypothesis):
any Unicode (NUL, lone surrogates, control characters) and any number, through each provider
family's parser (their recorded answers with the text and token counts replaced), through a
tool, through a provider's price, and from people (useChat, the decision views, the admin).

Whatever arrives, nothing is lost (what is stored is the text made storable,
``agentloop.storable_text``; every model call has its usage row, its counts and cost made safe),
nothing runs twice (a tool runs once; the chat takes the next message), and every error and
warning is one line. On SQLite and on PostgreSQL (``DATABASE_URL``) alike. The examples of a
test share its database (no flush between them: each makes its own chat), and each test
makes a bounded number of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.module_loading import import_string
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import providers
from agentloop.budgets import spend_of
from agentloop.messages import MAX_COST, MAX_TOKENS
from agentloop.models import Chat, ChatState, Message, ToolCall, Usage
from agentloop.runners import wait_for_embedded_jobs
from agentloop.storable_text import storable_json, storable_text
from agentloop.testing import tool_call
from agentloop.tools import AskPerson
from tests import bad_input
from tests.bad_input import (
    FAMILIES,
    CostedProvider,
    Family,
    echo,
    fail_with,
    reported_cost,
    reported_number,
    rewritten,
    typed_text,
    wild_text,
)
from tests.providers import cassettes
from tests.providers.aws import aws_env  # noqa: F401 (fixed AWS credentials: Bedrock)

#: a hundred-millionth of a dollar: what ``Usage.cost`` and the budgets count in.
UNIT = Decimal("0.00000001")


def bounded(examples: int) -> Any:
    """At most ``examples`` examples, no deadline (a database write takes what it takes),
    no example database written into the checkout."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def one_line(records: list[logging.LogRecord]) -> list[str]:
    """The messages of ``records`` that span more than one line."""
    return [record.getMessage() for record in records if "\n" in record.getMessage()]


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.WARNING, logger="agentloop")
    yield caplog
    assert one_line(caplog.records) == []


# -- the one boundary ------------------------------------------------------------------------------
@bounded(300)
@given(text=wild_text)
def test_storable_text_is_encodable_and_changes_only_nul_and_lone_surrogates(text):
    kept = storable_text(text)

    kept.encode("utf-8")  # no lone surrogate is left
    assert "\x00" not in kept and storable_text(kept) == kept
    if not any(0xD800 <= ord(character) <= 0xDFFF for character in text):
        assert kept == text.replace("\x00", "\ufffd")


@bounded(200)
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | wild_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(wild_text, inner, max_size=4),
    max_leaves=12,
))  # fmt: skip
def test_storable_json_is_json_every_database_takes(value):
    stored = storable_json(value)

    json.dumps(stored, allow_nan=False, ensure_ascii=False).encode("utf-8")  # no NaN, no inf
    assert not any("\x00" in text for text in strings(stored))
    assert storable_json(stored) == stored


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


# -- each provider family's parser ----------------------------------------------------------------
def _recordings() -> list[Any]:
    return [
        pytest.param(family, streamed, id=f"{family.name}-{'stream' if streamed else 'answer'}")
        for family in FAMILIES
        for streamed in (False, True)
        if not streamed or family.streamed is not None
    ]


@pytest.fixture
def family_provider(aws_env: Any) -> Iterator[Any]:  # noqa: F811 - the fixture, imported
    """``family_provider(family, interaction)``: the family's provider, answering with
    ``interaction``, registered under its own name until the test ends."""
    names: list[str] = []

    def make(family: Family, interaction: cassettes.Interaction) -> Any:
        cassettes.require_fixtures(cassettes.FIXTURES.parent / family.folder)
        provider_class = import_string(family.provider)
        replay = cassettes.Cassette("rewritten", [interaction])
        provider = provider_class(api_key="test-key", transport=replay.transport())
        answers: list[Any] = []
        ask = provider.request

        def request(*args: Any, **kwargs: Any) -> Any:  # what the parser made of the answer
            answers.append(ask(*args, **kwargs))
            return answers[-1]

        provider.request = request
        provider.answers = answers
        providers.register(provider_class.name, provider)
        names.append(provider_class.name)
        return provider

    yield make
    for name in names:
        providers.unregister(name)


@pytest.mark.django_db
@pytest.mark.parametrize(("family", "streamed"), _recordings())
@bounded(15)
@given(data=st.data())
def test_a_familys_answer_with_any_text_and_token_counts_is_stored_with_its_usage_row(
    family, streamed, data, family_provider, user, logged
):
    text = data.draw(wild_text, label="text")
    recorded = family.interaction(streamed)
    answer = rewritten(recorded, text, lambda: data.draw(reported_number, label="count"))
    provider = family_provider(family, answer)
    chat = Chat.objects.create(model=family.model, owner=user)
    chunks: list[Any] = []

    stored = chat.ask_later("Hi").generate(stream=chunks.append if streamed else None)

    (parsed,) = provider.answers
    stored.refresh_from_db()
    assert (stored.content, stored.thinking) == (
        storable_text(parsed.content),
        storable_text(parsed.thinking),
    )
    # The parser kept the text it was sent (in the answer, or in its thinking), as JSON
    # carries it (a surrogate pair escaped apart arrives as its one character).
    sent = json.loads(json.dumps(text))
    assert sent in parsed.content or sent in parsed.thinking
    (usage,) = Usage.objects.filter(chat=chat)
    counts = parsed.usage
    assert (usage.status, usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (
        "succeeded",
        counts.input_tokens,
        counts.output_tokens,
        counts.reasoning_tokens,
    )
    assert all(0 <= count <= MAX_TOKENS for count in counts.model_dump().values())
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE


# -- a tool ---------------------------------------------------------------------------------------
@pytest.mark.django_db
@bounded(30)
@given(text=wild_text, fails=st.booleans())
def test_a_tool_given_and_giving_any_text_runs_once_and_both_are_stored(
    text, fails, scripted, user, logged
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(echo, fail_with)
    name = "fail_with" if fails else "echo"
    scripted.add(tool_call(name, {"text": text}), "Done.", "Again.")
    bad_input.RUNS.clear()

    chat.ask("Go")
    chat.complete()  # a resume finds nothing left to run

    assert bad_input.RUNS == [text]
    call = ToolCall.objects.get(chat=chat)
    assert (call.arguments, call.state) == (
        storable_json({"text": text}),
        "failed" if fails else "succeeded",
    )
    result = Message.objects.get(chat=chat, role="tool")
    # A ToolError's text is its result (an empty one is named by its class).
    assert result.content == storable_text(text or ("ToolError" if fails else ""))
    assert chat.ask("And now?").content == "Again."  # no call is left pending


# -- a provider's price ---------------------------------------------------------------------------
@pytest.mark.django_db
@bounded(30)
@given(price=reported_cost)
def test_any_cost_is_recorded_safely_and_never_credits_a_budget(price, user, settings, logged):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"tokens_per_day": 10**12}}
    provider = CostedProvider(price).add("Fine.")
    providers.register("costed", provider)
    try:
        chat = Chat.objects.create(model="costed:test", owner=user)
        before = spend_of(user)
        chat.ask("Hi")
    finally:
        providers.unregister("costed")

    (usage,) = Usage.objects.filter(chat=chat)
    amount = None if price is None else Decimal(str(price))
    if amount is None or amount.is_nan() or amount < 0:
        assert usage.cost is None  # unknown: no price at all
    elif amount > MAX_COST:
        assert usage.cost == MAX_COST  # infinity included
    else:
        assert abs(usage.cost - amount) <= UNIT  # the column keeps 8 decimal places
    after = spend_of(user)
    charged = after.cost_per_day - before.cost_per_day
    assert abs(charged - (usage.cost or 0)) <= UNIT  # never below zero: never a credit
    assert after.reserved_cost == 0 and after.reserved_tokens == 0


# -- people ---------------------------------------------------------------------------------------
@pytest.fixture
def quick(settings) -> Iterator[None]:
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "EVENTS_POLL_INTERVAL": 0.02,
        "EVENTS_KEEPALIVE": 0.5,
        "PARTIAL_SAVE_INTERVAL": 0.0,
    }
    yield
    wait_for_embedded_jobs(30)


def _refusal(response: Any) -> str:
    """A refused request's body: one line."""
    body = response.content.decode()
    assert response.status_code < 500 and "\n" not in body.strip(), body
    return body


@pytest.mark.django_db(transaction=True)
@bounded(15)
@given(text=wild_text)
def test_usechat_takes_any_text_and_stores_it_storable(text, owner, user, scripted, quick):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    sent = text.strip()  # as useChat takes a message's text
    if sent:
        scripted.add("Noted.")
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}
    payload = {"id": str(chat.pk), "messages": [message], "trigger": "submit-message"}

    response = owner.post(reverse("agentloop:usechat"), json.dumps(payload), "application/json")

    if not sent:
        assert response.status_code == 400
        assert _refusal(response) and not chat.messages.exists()
        return
    assert response.status_code == 200, response.content
    body = b"".join(response.streaming_content).decode()
    assert body.endswith("data: [DONE]\n\n")
    assert wait_for_embedded_jobs(30)
    assert list(chat.messages.values_list("role", "content")) == [
        ("user", storable_text(sent)),
        ("assistant", "Noted."),
    ]
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE


def _form(client: Client, url: str, fields: dict[str, str]) -> Any:
    # As a browser posts a form (what it can type: no lone surrogates).
    return client.post(url, urlencode(fields), "application/x-www-form-urlencoded")


@pytest.mark.django_db
@bounded(20)
@given(text=typed_text, where=st.sampled_from(["view", "admin"]))
def test_a_persons_answer_with_any_typed_text_is_stored_storable(
    text, where, owner, admin_client, user, scripted, logged
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(AskPerson)
    scripted.add(tool_call("ask_person", {"question": "Which account?"}))
    chat.ask("Pay Bob")
    call = ToolCall.objects.get(chat=chat, state="waiting")
    if where == "view":
        url = reverse("agentloop:answer", args=[chat.pk, call.pk])
        response = _form(owner, url, {"text": text})
    else:
        url = reverse("admin:agentloop_chat_inbox_decide", args=[call.pk])
        response = _form(admin_client, url, {"decision": "answer", "text": text})

    call.refresh_from_db()
    if not text.strip():  # refused: the call still waits
        assert response.status_code == 400 and call.state == "waiting"
        return
    assert response.status_code in (204, 302), response.content
    assert Message.objects.get(chat=chat, role="tool").content == storable_text(text)
    scripted.add("Thanks.")
    assert chat.complete().content == "Thanks."  # nothing is left pending


@pytest.mark.django_db
@bounded(20)
@given(reason=typed_text, where=st.sampled_from(["view", "admin"]))
def test_a_denial_with_any_typed_reason_is_stored_storable(
    reason, where, owner, admin_client, user, scripted, logged
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(bad_input.guarded)
    scripted.add(tool_call("guarded", {"text": "x"}))
    chat.ask("Do it")
    call = ToolCall.objects.get(chat=chat, state="waiting")
    bad_input.RUNS.clear()
    if where == "view":
        url = reverse("agentloop:deny", args=[chat.pk, call.pk])
        response = _form(owner, url, {"reason": reason})
        sent = reason[:2000]
    else:
        url = reverse("admin:agentloop_chat_inbox_decide", args=[call.pk])
        response = _form(admin_client, url, {"decision": "deny", "reason": reason})
        sent = reason.strip()[:2000]

    assert response.status_code in (204, 302), response.content
    call.refresh_from_db()
    assert call.decision == "denied"
    if sent.strip():
        assert call.decision_reason == storable_text(sent)
    scripted.add("Understood.")
    assert chat.complete().content == "Understood."
    assert bad_input.RUNS == []  # a denied call never runs
