"""Compaction and context windows (docs/long-conversations.md): a persisted chat driven past a
small context window keeps answering; requests after a compaction hold the instructions, one
summary and the recent rows; every row stays in the database and the admin timeline."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse

import agentloop
from agentloop import providers
from agentloop.engine._model_calls import Summaries
from agentloop.engine.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX
from agentloop.exceptions import ConfigurationError, ContextLengthError
from agentloop.messages import ModelRequest, TokenUsage
from agentloop.models import Chat, Message, ToolCall, Usage
from agentloop.testing import FunctionProvider, reply, tool_call
from tests.tools import add

pytestmark = pytest.mark.django_db

WINDOW = 400  # tokens: a few turns of the scripted conversation


def request_tokens(request: ModelRequest) -> int:
    """What a provider would report as input tokens: four characters a token."""
    return sum(len(m.content) for m in request.messages) // 4


def is_summary_call(request: ModelRequest) -> bool:
    return bool(request.messages) and request.messages[0].content == SUMMARY_INSTRUCTIONS


class Model:
    """A scripted model that reports its input like a real one and tells summary calls apart."""

    def __init__(self, tool_every: int = 0) -> None:
        self.answers = 0
        self.summaries = 0
        self.tool_every = tool_every
        self.provider = FunctionProvider(self.answer)

    def answer(self, request: ModelRequest) -> object:
        usage = TokenUsage(input_tokens=request_tokens(request), output_tokens=30)
        if is_summary_call(request):
            self.summaries += 1
            return reply(f"Summary {self.summaries}: the user asked questions.", usage=usage)
        self.answers += 1
        last = request.messages[-1]
        if self.tool_every and last.role == "user" and self.answers % self.tool_every == 0:
            return reply("", tool_call("add", {"a": 2, "b": 3}), usage=usage)
        return reply(f"Answer {self.answers}: " + "words " * 40, usage=usage)

    @property
    def requests(self) -> list[ModelRequest]:
        return [r for r in self.provider.requests if not is_summary_call(r)]


@pytest.fixture
def model():
    scripted = Model(tool_every=2)
    providers.register("scripted", scripted.provider)
    yield scripted
    providers.unregister("scripted")


@pytest.fixture
def chat(user):
    return (
        Chat.objects.create(model="scripted:test", owner=user)
        .with_instructions("You answer questions.")
        .with_tools(add)
        .with_context_window(WINDOW)
        .with_compaction(at=0.8, keep_recent=4)
    )


def drive(chat, turns: int) -> None:
    for turn in range(turns):
        answer = chat.ask(f"Question {turn}: " + "please explain this at length " * 5)
        assert answer.role == "assistant"
        assert answer.content.startswith("Answer")


def assert_window(request: ModelRequest) -> None:
    """Instructions, one summary, then recent rows; no tool result without its call."""
    roles = [m.role for m in request.messages]
    assert roles[0] == "system"
    assert request.messages[0].content == "You answer questions."
    summaries = [m for m in request.messages if m.content.startswith(SUMMARY_PREFIX)]
    assert len(summaries) == 1
    assert request.messages[1] is summaries[0]
    assert request.messages[1].role == "user"
    called = set()
    for message in request.messages:
        called |= {call.id for call in message.tool_calls}
        if message.role == "tool":
            assert message.tool_call_id in called


def test_a_chat_past_its_context_window_keeps_answering(chat, model):
    drive(chat, 12)

    assert model.summaries >= 2
    summaries = Message.objects.filter(chat=chat, role="summary")
    assert summaries.count() == model.summaries
    # Each request after the first compaction holds the instructions, the latest summary and
    # the recent rows, and stays under the window.
    first = chat.messages.filter(role="summary").order_by("id").first()
    after = [r for r in model.requests if any(SUMMARY_PREFIX in m.content for m in r.messages)]
    assert after
    for request in after:
        assert_window(request)
        assert request_tokens(request) <= WINDOW
    latest = summaries.order_by("-id").first()
    assert model.requests[-1].messages[1].content.endswith(latest.content)
    assert first.content != latest.content


def test_an_async_chat_is_compacted_the_same_way(chat, model):
    """The async verbs share the step's phases: compaction included (docs/async.md)."""

    async def drive_async() -> None:
        for turn in range(12):
            answer = await chat.aask(f"Question {turn}: " + "please explain this at length " * 5)
            assert answer.content.startswith("Answer")

    async_to_sync(drive_async)()

    assert model.summaries >= 2
    assert Message.objects.filter(chat=chat, role="summary").count() == model.summaries
    after = [r for r in model.requests if any(SUMMARY_PREFIX in m.content for m in r.messages)]
    assert after
    for request in after:
        assert_window(request)
        assert request_tokens(request) <= WINDOW


def test_every_row_stays_in_the_database_and_the_summary_has_a_usage_row(chat, model):
    drive(chat, 12)

    rows = list(chat.messages.all())
    users = [m for m in rows if m.role == "user"]
    assert [m.content.split(":")[0] for m in users] == [f"Question {n}" for n in range(12)]
    tool_rows = sum(1 for m in rows if m.role == "tool")
    assert tool_rows == ToolCall.objects.filter(message__chat=chat).count() > 0
    summary_usage = Usage.objects.filter(chat=chat, message__role="summary")
    assert summary_usage.count() == model.summaries
    assert all(u.status == "succeeded" and u.input_tokens > 0 for u in summary_usage)


def test_the_summary_call_sees_tool_calls_with_their_results(chat, model):
    drive(chat, 6)

    summary_calls = [r for r in model.provider.requests if is_summary_call(r)]
    assert summary_calls
    text = summary_calls[0].messages[1].content
    assert "(calls add " in text
    assert "[tool result add" in text
    assert "Question 0" in text


def test_the_admin_timeline_shows_the_summary_as_such_and_every_row(admin_client, chat, model):
    drive(chat, 8)

    response = admin_client.get(reverse("admin:agentloop_chat_change", args=[chat.pk]))
    content = response.content.decode()

    assert response.status_code == 200
    assert "summary of earlier messages" in content
    entry = content[content.index('class="agentloop-entry agentloop-summary') :]
    entry = entry[: entry.index("</li>")]
    summary = chat.messages.filter(role="summary").first()
    usage = Usage.objects.get(message=summary)
    assert summary.content in entry
    assert f"{usage.input_tokens} in / {usage.output_tokens} out" in entry
    for turn in range(8):
        assert f"Question {turn}:" in content


def test_the_example_page_shows_every_row_and_the_summary_as_such(client, user, chat, model):
    drive(chat, 8)
    client.force_login(user)

    content = client.get(reverse("chat_detail", args=[chat.pk])).content.decode()

    assert 'class="msg msg-summary"' in content
    assert "summary of earlier messages" in content
    for turn in range(8):
        assert f"Question {turn}:" in content


def test_a_fresh_instance_reads_the_compaction_settings(chat, model):
    fresh = Chat.objects.get(pk=chat.pk)
    config = fresh.conversation.store.config.get_config()

    assert config.context_window == WINDOW
    assert config.compaction is not None
    assert (config.compaction.at, config.compaction.keep_recent) == (0.8, 4)


def test_a_small_chat_is_not_compacted(user, model):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_compaction()
    chat.with_context_window(100_000)
    drive(chat, 3)

    assert model.summaries == 0


def test_the_catalog_context_window_applies_without_with_context_window():
    catalog_window = providers.catalog.lookup("claude-haiku-4-5")
    assert catalog_window is not None and catalog_window.context_window

    memory = agentloop.chat(model="anthropic:claude-haiku-4-5").with_compaction()
    config = memory.store.config.get_config()

    summaries = Summaries(memory.store, emit=lambda *args: None)

    assert not summaries.compaction_due([], config, "claude-haiku-4-5")


def test_a_memory_chat_compacts_too(model):
    memory = (
        agentloop.chat(model="scripted:test")
        .with_instructions("You answer questions.")
        .with_context_window(WINDOW)
        .with_compaction(keep_recent=2)
    )
    for turn in range(8):
        memory.ask(f"Question {turn}: " + "please explain this at length " * 5)

    assert model.summaries >= 1
    assert sum(1 for m in memory.messages if m.role == "user") == 8
    assert_window(model.requests[-1])


def test_a_summary_model_other_than_the_chat_s_writes_the_summary(chat, model):
    other = FunctionProvider(lambda request: reply("Summary by the other model."))
    providers.register("other", other)
    try:
        chat.with_compaction(at=0.8, keep_recent=4, model="other:small")
        drive(chat, 6)
    finally:
        providers.unregister("other")

    assert other.requests and all(is_summary_call(r) for r in other.requests)
    summary = chat.messages.filter(role="summary").first()
    assert summary.content == "Summary by the other model."
    assert Usage.objects.filter(message=summary, provider="other", model="small").exists()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.with_compaction(at=0), "0 < at <= 1"),
        (lambda c: c.with_compaction(keep_recent=0), "keep_recent >= 1"),
        (lambda c: c.with_context_window(0), "positive number of tokens"),
        (lambda c: c.with_compaction(model="nobody-knows"), "Can't tell which provider"),
    ],
)
def test_bad_settings_get_a_one_line_error(call, message):
    memory = agentloop.chat(model="scripted:test")
    with pytest.raises(ConfigurationError, match=message) as caught:
        call(memory)
    assert "\n" not in str(caught.value)
    assert memory.store.config.get_config().compaction is None


def test_compaction_off_sends_every_row(user, model):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_context_window(WINDOW)
    chat.with_compaction().with_compaction(at=None)
    drive(chat, 8)

    assert model.summaries == 0
    sent = [m.content for m in model.requests[-1].messages if m.role == "user"]
    assert [text.split(":")[0] for text in sent] == [f"Question {n}" for n in range(8)]


def test_context_length_error_without_compaction_fails_the_chat(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(ContextLengthError("prompt is too long", status=400))

    with pytest.raises(ContextLengthError):
        chat.ask("hello")
    chat.refresh_from_db()
    assert chat.state == "failed"
    assert "prompt is too long" in chat.error
