"""Batches (docs/design.md §8): many chats' next model call as one provider batch, tool rounds
local.

The provider side is the real ``AnthropicProvider`` talking to ``tests.batch_server``, an
``httpx.MockTransport`` playing Anthropic's Message Batches API: each batch reads as in
progress once, then ended; answers follow the rules in each chat's latest user message.
"""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO

import httpx
import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import agentloop
from agentloop import providers, signals
from agentloop.batches import cancel as cancel_batch
from agentloop.batches import refresh as refresh_batch
from agentloop.django_store.leases import Lease
from agentloop.exceptions import BatchError
from agentloop.messages import TokenUsage
from agentloop.models import (
    Batch,
    BatchItemStatus,
    BatchStatus,
    Chat,
    ChatState,
)
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.batch_apis import batch_api
from agentloop.providers.catalog import price_of
from agentloop.testing import reply, tool_call
from tests.batch_server import USAGE, FakeBatches
from tests.helpers import transcript
from tests.tools import step_one, step_three, step_two, transfer

pytestmark = pytest.mark.django_db

MODEL = "anthropic:claude-haiku-4-5"
#: the batch price of one answer of the fake server: half the catalog price.
BATCH_COST = price_of("claude-haiku-4-5", TokenUsage(**USAGE)) / 2


@pytest.fixture
def fake():
    """Anthropic's batch API, played by FakeBatches, registered as the "anthropic" provider."""
    server = FakeBatches()
    providers.register(
        "anthropic", AnthropicProvider(api_key="test-key", transport=server.transport())
    )
    yield server
    providers.unregister("anthropic")


def new_chat(user, question, *tools, model=MODEL):
    chat = Chat.objects.create(model=model, owner=user)
    if tools:
        chat.with_tools(*tools)
    return chat.ask_later(question)


def poll_until_collected(batch, polls=10):
    for _ in range(polls):
        refresh_batch(batch)
        batch.refresh_from_db()
        if batch.collected_at is not None:
            return batch
    raise AssertionError(f"batch {batch.pk} still open after {polls} polls: {batch.status}")


# -- submitting ------------------------------------------------------------------------------
def test_a_batch_sends_each_chats_request_and_records_the_batch(fake, user):
    chats = [new_chat(user, "hello"), new_chat(user, "bonjour")]

    batch = agentloop.batch(chats)

    batch.refresh_from_db()
    assert (batch.provider, batch.model, batch.status) == (
        "anthropic",
        "claude-haiku-4-5",
        "in_progress",
    )
    assert batch.provider_batch_id == "msgbatch_001"
    assert batch.request_count == 2
    assert batch.submitted_at is not None and batch.collected_at is None
    assert [(i.chat_id, i.custom_id, i.status) for i in batch.items.all()] == [
        (chats[0].pk, "0", "pending"),
        (chats[1].pk, "1", "pending"),
    ]
    (requests,) = fake.submitted()
    assert [r["params"]["messages"][-1]["content"][0]["text"] for r in requests] == [
        "hello",
        "bonjour",
    ]


def test_each_batched_request_is_the_request_generate_sends(fake, user):
    sent = []

    def direct(request):
        sent.append(request.read())
        return httpx.Response(200, json={"content": [{"type": "text", "text": "hi"}], "usage": {}})

    batched = new_chat(user, "What is 2 + 2?", step_one).with_instructions("Be terse.")
    batched.with_temperature(0.2).with_max_output_tokens(300)
    direct_chat = new_chat(user, "What is 2 + 2?", step_one).with_instructions("Be terse.")
    direct_chat.with_temperature(0.2).with_max_output_tokens(300)

    agentloop.batch([batched])
    providers.register(
        "anthropic", AnthropicProvider(api_key="test-key", transport=httpx.MockTransport(direct))
    )
    direct_chat.generate()

    ((request,),) = fake.submitted()
    assert request["params"] == json.loads(sent[0])


def test_a_queryset_of_chats_can_be_batched(fake, user):
    chats = [new_chat(user, "hello"), new_chat(user, "bonjour")]

    batch = agentloop.batch(Chat.objects.filter(pk__in=[c.pk for c in chats]), auto_continue=True)

    assert batch.auto_continue
    assert sorted(batch.items.values_list("chat_id", flat=True)) == sorted(c.pk for c in chats)


def test_the_deprecated_model_methods_warn_and_still_work(fake, user):
    chat = new_chat(user, "hello")

    with pytest.warns(DeprecationWarning, match=r"agentloop\.batch\(chats\)"):
        batch = Chat.objects.filter(pk=chat.pk).batch()
    with pytest.warns(DeprecationWarning, match=r"agentloop\.batches\.refresh\(batch\)"):
        assert batch.refresh() is batch
    with pytest.warns(DeprecationWarning, match=r"agentloop\.batches\.cancel\(batch\)"):
        assert batch.cancel() is batch
    assert list(batch.items.values_list("chat_id", flat=True)) == [chat.pk]


def test_chats_not_awaiting_the_model_are_refused_by_name(fake, user, scripted):
    ready = new_chat(user, "hello")
    answered = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(reply("done"))
    answered.ask("hi")
    with_tools = Chat.objects.create(model="scripted:test", owner=user).with_tools(step_one)
    scripted.add(tool_call("step_one"))
    with_tools.ask_later("go").generate()
    empty = Chat.objects.create(model=MODEL)

    with pytest.raises(BatchError) as caught:
        agentloop.batch([ready, answered, with_tools, empty])

    message = str(caught.value)
    assert f"chat #{answered.pk} is not awaiting the model: its last answer" in message
    assert f"chat #{with_tools.pk} is not awaiting the model: it has tool calls" in message
    assert f"chat #{empty.pk} is not awaiting the model" in message
    assert f"#{ready.pk} " not in message
    assert not Batch.objects.exists()
    assert fake.received == []


def test_unsaved_and_in_memory_chats_are_refused(fake, user):
    with pytest.raises(BatchError, match="not a persisted agentloop.models.Chat"):
        agentloop.batch([agentloop.chat(MODEL).ask_later("hi")])
    with pytest.raises(BatchError, match="is not saved"):
        agentloop.batch([Chat(model=MODEL)])


def test_an_empty_batch_is_refused(fake):
    with pytest.raises(BatchError, match="No chats"):
        agentloop.batch([])


def test_a_chat_already_in_an_open_batch_is_refused(fake, user):
    chat = new_chat(user, "hello")
    first = agentloop.batch([chat])

    with pytest.raises(BatchError, match=f"chat #{chat.pk} is already in batch #{first.pk}"):
        agentloop.batch([chat])


def test_a_chat_running_in_the_background_is_refused(fake, user):
    chat = new_chat(user, "hello")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    with pytest.raises(BatchError, match=f"chat #{chat.pk} is queued in the background"):
        agentloop.batch([chat])


def test_a_chat_with_a_pending_cancel_is_refused(fake, user):
    chat = new_chat(user, "hello")
    # A cancel that reached a run which stopped without seeing it (a crash): still pending.
    Chat.objects.filter(pk=chat.pk).update(cancel_requested_at=timezone.now())

    with pytest.raises(BatchError, match=f"chat #{chat.pk} has a cancel request pending"):
        agentloop.batch([chat])


def test_a_chat_at_its_limit_is_refused_and_recorded_as_stopped(fake, user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(step_one)
    scripted.add(tool_call("step_one"))
    chat.ask_later("go").generate()
    chat.run_tools()  # one model call made this turn: the limit of one is reached
    chat.with_model(MODEL).with_limits(max_model_calls=1)

    with pytest.raises(BatchError, match=f"chat #{chat.pk} is stopped by a limit: max_model_calls"):
        agentloop.batch([chat])
    chat.refresh_from_db()
    assert chat.state == ChatState.STOPPED


def test_chats_of_different_providers_are_refused(fake, user, scripted):
    claude = new_chat(user, "hello")
    other = new_chat(user, "hello", model="scripted:test")

    with pytest.raises(
        BatchError,
        match=rf"One provider per batch.*anthropic \(chat #{claude.pk}\); "
        rf"scripted \(chat #{other.pk}\)",
    ):
        agentloop.batch([claude, other])


def test_a_provider_without_a_batch_api_is_refused(user, scripted):
    chat = new_chat(user, "hello", model="scripted:test")

    with pytest.raises(BatchError, match="Provider 'scripted' has no batch API"):
        agentloop.batch([chat])


def test_mixed_models_are_refused_where_the_provider_batches_one_model(user):
    from agentloop.providers.openai_responses import OpenAIResponsesProvider

    providers.register("openai-responses", OpenAIResponsesProvider(api_key="test-key"))
    try:
        nano = new_chat(user, "hi", model="openai-responses:gpt-5-nano")
        mini = new_chat(user, "hi", model="openai-responses:gpt-5-mini")
        with pytest.raises(BatchError, match="batch holds one model; these chats use gpt-5-nano"):
            agentloop.batch([nano, mini])
    finally:
        providers.unregister("openai-responses")


def test_mixed_models_go_into_one_anthropic_batch(fake, user):
    haiku = new_chat(user, "hi")
    sonnet = new_chat(user, "hi", model="anthropic:claude-sonnet-4-5")

    batch = agentloop.batch([haiku, sonnet])

    assert batch.model == ""
    assert list(batch.items.values_list("model", flat=True)) == [
        "claude-haiku-4-5",
        "claude-sonnet-4-5",
    ]
    assert [r["params"]["model"] for r in fake.submitted()[0]] == [
        "claude-haiku-4-5",
        "claude-sonnet-4-5",
    ]


def test_a_refused_submission_is_raised_and_recorded_as_a_failed_batch(fake, user):
    chat = new_chat(user, "hello")
    fake.failures.append(400)

    with pytest.raises(agentloop.ProviderError):
        agentloop.batch([chat])

    batch = Batch.objects.get()
    assert batch.status == BatchStatus.FAILED and batch.collected_at is not None
    assert "BadRequestError" in batch.error
    assert batch.items.get().status == BatchItemStatus.FAILED
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE  # nothing was sent: the chat can go into another batch
    assert agentloop.batch([chat]).status == BatchStatus.IN_PROGRESS


def test_the_model_call_started_signal_is_sent_when_the_batch_is_sent(fake, user):
    started = []

    def receiver(sender, chat, **kwargs):
        started.append(chat.pk)

    chats = [new_chat(user, "a"), new_chat(user, "b")]
    signals.model_call_started.connect(receiver)
    try:
        agentloop.batch(chats)
    finally:
        signals.model_call_started.disconnect(receiver)
    assert started == [c.pk for c in chats]


# -- collecting ------------------------------------------------------------------------------
def test_answers_are_appended_once_the_batch_has_ended(fake, user):
    chats = [new_chat(user, "hello"), new_chat(user, "bonjour")]
    batch = agentloop.batch(chats)

    refresh_batch(batch)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS and batch.polled_at is not None
    assert [transcript(c)[-1][0] for c in chats] == ["user", "user"]

    refresh_batch(batch)
    batch.refresh_from_db()

    assert batch.status == BatchStatus.ENDED and batch.collected_at is not None
    assert (batch.succeeded_count, batch.failed_count) == (2, 0)
    assert [transcript(c) for c in chats] == [
        [("user", "hello"), ("assistant", "echo: hello")],
        [("user", "bonjour"), ("assistant", "echo: bonjour")],
    ]
    answer = chats[0].messages.get(role="assistant")
    assert answer.model == "claude-haiku-4-5-20251001"
    assert answer.finish_reason == "stop"
    item = batch.items.get(chat=chats[0])
    assert item.status == BatchItemStatus.SUCCEEDED and item.message == answer


def test_each_answer_has_a_usage_row_at_the_batch_price(fake, user):
    chat = new_chat(user, "hello")
    poll_until_collected(agentloop.batch([chat]))

    (usage,) = chat.usage_records.all()
    assert (usage.provider, usage.model, usage.status) == (
        "anthropic",
        "claude-haiku-4-5",
        "succeeded",
    )
    assert (usage.input_tokens, usage.output_tokens) == (100, 20)
    assert usage.cost == BATCH_COST == Decimal("0.0001")
    assert usage.owner == user
    assert usage.message == chat.messages.get(role="assistant")


def test_the_batch_price_is_half_the_catalog_price():
    api = batch_api(AnthropicProvider(api_key="test-key"))
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)

    assert api.cost("claude-haiku-4-5", usage) == Decimal("3.00000000")  # (1 + 5) / 2
    assert api.cost("unknown-model", usage) is None


def test_message_added_is_sent_for_each_batched_answer(fake, user):
    added = []

    def receiver(sender, chat, message, **kwargs):
        added.append((chat.pk, message.role, message.content))

    chat = new_chat(user, "hello")
    batch = agentloop.batch([chat])
    signals.message_added.connect(receiver)
    try:
        poll_until_collected(batch)
    finally:
        signals.message_added.disconnect(receiver)
    assert added == [(chat.pk, "assistant", "echo: hello")]


def test_a_failed_request_is_recorded_on_its_chat(fake, user):
    good, bad = new_chat(user, "hello"), new_chat(user, "fail please")

    batch = poll_until_collected(agentloop.batch([good, bad]))

    assert (batch.succeeded_count, batch.failed_count) == (1, 1)
    bad.refresh_from_db()
    assert bad.state == ChatState.FAILED
    assert "BadRequestError" in bad.error and "scripted failure" in bad.error
    assert f"Batch #{batch.pk}" in bad.error
    assert transcript(bad) == [("user", "fail please")]
    (usage,) = bad.usage_records.all()
    assert usage.status == "failed" and "scripted failure" in usage.error
    item = batch.items.get(chat=bad)
    assert item.status == BatchItemStatus.FAILED and "scripted failure" in item.error
    assert transcript(good)[-1] == ("assistant", "echo: hello")


def test_a_failed_chat_can_go_into_a_new_batch(fake, user):
    chat = new_chat(user, "fail please")
    poll_until_collected(agentloop.batch([chat]))

    batch = agentloop.batch([chat])

    assert batch.items.get().chat == chat


def test_a_two_round_tool_conversation_for_several_chats_runs_through_batches(fake, user):
    tools = (step_one, step_two, step_three)
    chats = [
        new_chat(user, "tools:step_one first", *tools),
        new_chat(user, "tools:step_two,step_three second", *tools),
        new_chat(user, "tools:step_three third", *tools),
    ]
    failing = new_chat(user, "fail fourth", *tools)

    first = agentloop.batch([*chats, failing], auto_continue=True)
    refresh_batch(first)  # in progress
    first.refresh_from_db()
    assert first.status == BatchStatus.IN_PROGRESS
    refresh_batch(first)  # ended: answers in, tools run, the next batch sent
    first.refresh_from_db()

    assert first.status == BatchStatus.ENDED and first.collected_at is not None
    second = Batch.objects.get(previous=first)
    assert second.auto_continue and second.status == BatchStatus.IN_PROGRESS
    assert sorted(second.items.values_list("chat_id", flat=True)) == [c.pk for c in chats]
    assert transcript(chats[1]) == [
        ("user", "tools:step_two,step_three second"),
        ("assistant", ""),
        ("tool", "two done"),
        ("tool", "three done"),
    ]
    poll_until_collected(second)

    assert [transcript(c)[-1] for c in chats] == [
        ("assistant", "done: one done"),
        ("assistant", "done: two done; three done"),
        ("assistant", "done: three done"),
    ]
    assert [m.role for m in chats[1].messages.order_by("id")] == [
        "user", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    for chat in chats:
        chat.refresh_from_db()
        assert (chat.state, chat.error, chat.lease_token) == (ChatState.IDLE, "", "")
        assert chat.is_complete()
        assert list(chat.usage_records.values_list("status", "cost")) == [
            ("succeeded", BATCH_COST),
            ("succeeded", BATCH_COST),
        ]
    failing.refresh_from_db()
    assert failing.state == ChatState.FAILED
    assert not Batch.objects.filter(previous=second).exists()
    assert len(fake.submitted()) == 2
    # The second round sent each chat's whole conversation, tool results included.
    second_request = fake.submitted()[1][1]["params"]["messages"]
    assert [m["role"] for m in second_request] == ["user", "assistant", "user"]
    assert [b["type"] for b in second_request[2]["content"]] == ["tool_result", "tool_result"]


def test_without_auto_continue_a_chat_that_ran_its_tools_goes_back_to_the_normal_loop(
    fake, user, django_capture_on_commit_callbacks
):
    chat = new_chat(user, "tools:step_one go", step_one)

    with django_capture_on_commit_callbacks() as callbacks:
        poll_until_collected(agentloop.batch([chat]))

    chat.refresh_from_db()
    assert chat.state == ChatState.QUEUED  # complete_later(): the next step is a normal call
    assert len(callbacks) == 1
    assert transcript(chat)[-1] == ("tool", "one done")
    assert Batch.objects.count() == 1


def test_a_chat_whose_tools_wait_for_approval_is_left_waiting(fake, user):
    chat = new_chat(user, "tools:transfer go", transfer)

    poll_until_collected(agentloop.batch([chat], auto_continue=True))

    chat.refresh_from_db()
    assert chat.state == ChatState.WAITING
    assert [c.name for c in chat.pending_approvals()] == ["transfer"]
    assert Batch.objects.count() == 1


def test_a_chat_that_reaches_its_limit_after_its_tools_is_stopped_not_batched(fake, user):
    chat = new_chat(user, "tools:step_one go", step_one).with_limits(max_model_calls=1)

    poll_until_collected(agentloop.batch([chat], auto_continue=True))

    chat.refresh_from_db()
    assert chat.state == ChatState.STOPPED
    assert "max_model_calls" in chat.stop_reason
    assert Batch.objects.count() == 1


def test_a_chat_busy_when_its_answer_arrives_gets_it_at_the_next_poll(fake, user):
    busy, free = new_chat(user, "one"), new_chat(user, "two")
    batch = agentloop.batch([busy, free])
    refresh_batch(batch)  # in progress
    lease = Lease.take(Chat, busy.pk)

    refresh_batch(batch)
    batch.refresh_from_db()

    assert batch.collected_at is None
    assert batch.items.get(chat=busy).status == BatchItemStatus.PENDING
    assert transcript(free)[-1] == ("assistant", "echo: two")
    lease.release(state="idle")
    refresh_batch(batch)
    batch.refresh_from_db()
    assert batch.collected_at is not None
    assert transcript(busy)[-1] == ("assistant", "echo: one")


def test_a_batch_another_poller_holds_is_left_alone(fake, user):
    batch = agentloop.batch([new_chat(user, "hello")])
    Batch.objects.filter(pk=batch.pk).update(
        claim_token="other", claimed_until=batch.created_at.replace(year=2999)
    )
    requests_before = len(fake.received)

    refresh_batch(batch)

    assert len(fake.received) == requests_before


def test_a_provider_error_while_polling_leaves_the_batch_open_for_the_next_poll(fake, user):
    chat = new_chat(user, "hello")
    agentloop.batch([chat])
    fake.failures.append(503)

    (polled,) = agentloop.batches.poll()

    polled.refresh_from_db()
    assert polled.collected_at is None and "Polling failed: ServerError" in polled.error
    poll_until_collected(polled)
    assert transcript(chat)[-1] == ("assistant", "echo: hello")


# -- cancelling ------------------------------------------------------------------------------
def test_a_chat_cancelled_in_a_batch_is_released_and_its_answer_discarded(fake, user):
    cancelled_signals = []

    def receiver(sender, chat, **kwargs):
        cancelled_signals.append(chat.pk)

    kept, cancelled = new_chat(user, "keep"), new_chat(user, "drop")
    batch = agentloop.batch([kept, cancelled])
    Chat.objects.get(pk=cancelled.pk).cancel()  # from another request, say

    signals.chat_cancelled.connect(receiver)
    try:
        refresh_batch(batch)  # still in progress: the chat is released at once
    finally:
        signals.chat_cancelled.disconnect(receiver)
    cancelled.refresh_from_db()
    assert cancelled.cancel_requested_at is None
    assert cancelled_signals == [cancelled.pk]
    assert batch.items.get(chat=cancelled).cancelled_at is not None
    cancelled.ask_later("something else")  # usable again while the batch runs

    poll_until_collected(batch)

    assert transcript(cancelled) == [("user", "drop"), ("user", "something else")]
    item = batch.items.get(chat=cancelled)
    assert item.status == BatchItemStatus.CANCELLED and item.message is None
    (usage,) = cancelled.usage_records.all()  # the tokens were spent: accounted, not appended
    assert (usage.status, usage.input_tokens, usage.cost) == ("cancelled", 100, BATCH_COST)
    assert transcript(kept)[-1] == ("assistant", "echo: keep")


def test_a_chat_cancelled_as_its_answer_arrives_gets_no_answer(fake, user):
    chat = new_chat(user, "hello")
    batch = agentloop.batch([chat])
    refresh_batch(batch)  # in progress
    fake.before_results = chat.cancel  # the cancel comes while the results download

    refresh_batch(batch)

    chat.refresh_from_db()
    assert transcript(chat) == [("user", "hello")]
    assert chat.cancel_requested_at is None and chat.state == ChatState.IDLE
    assert batch.items.get().status == BatchItemStatus.CANCELLED
    (usage,) = chat.usage_records.all()
    assert (usage.status, usage.output_tokens) == ("cancelled", 20)


def test_when_every_chat_of_a_batch_is_cancelled_the_provider_batch_is_cancelled(fake, user):
    chats = [new_chat(user, "a"), new_chat(user, "b")]
    batch = agentloop.batch(chats)
    for chat in chats:
        chat.cancel()

    refresh_batch(batch)

    assert ("POST", f"/v1/messages/batches/{batch.provider_batch_id}/cancel", {}) in fake.received
    poll_until_collected(batch)
    assert batch.status == BatchStatus.CANCELLED
    assert [i.status for i in batch.items.all()] == [BatchItemStatus.CANCELLED] * 2
    assert all(transcript(c) == [("user", c.messages.first().content)] for c in chats)
    assert not any(c.usage_records.exists() for c in chats)  # nothing ran: nothing spent


def test_an_answer_for_a_chat_that_moved_on_is_discarded(fake, user, scripted):
    chat = new_chat(user, "hello")
    batch = agentloop.batch([chat])
    scripted.add(reply("a direct answer"))
    chat.with_model("scripted:test").generate()  # the chat did not wait for the batch

    poll_until_collected(batch)

    assert transcript(chat) == [("user", "hello"), ("assistant", "a direct answer")]
    item = batch.items.get()
    assert item.status == BatchItemStatus.DISCARDED and "moved on" in item.error
    assert list(chat.usage_records.order_by("id").values_list("status", "model")) == [
        ("succeeded", "test"),
        ("cancelled", "claude-haiku-4-5"),
    ]


def test_cancelling_a_batch_leaves_its_chats_awaiting_the_model(fake, user):
    chats = [new_chat(user, "a"), new_chat(user, "b")]
    batch = agentloop.batch(chats)

    cancel_batch(batch)

    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLING
    poll_until_collected(batch)
    assert batch.status == BatchStatus.CANCELLED
    assert [i.status for i in batch.items.all()] == [BatchItemStatus.NOT_RUN] * 2
    for chat in chats:
        chat.refresh_from_db()
        assert chat.state == ChatState.IDLE and chat.error == ""
        assert transcript(chat)[-1][0] == "user"
    assert agentloop.batch(chats).status == BatchStatus.IN_PROGRESS


# -- the command, the task, the admin --------------------------------------------------------
def test_the_batches_command_polls_open_batches_and_lists_them(fake, user):
    chat = new_chat(user, "hello")
    batch = agentloop.batch([chat])
    out = StringIO()

    call_command("agentloop", "batches", stdout=out)
    call_command("agentloop", "batches", stdout=out)

    assert transcript(chat)[-1] == ("assistant", "echo: hello")
    text = out.getvalue()
    assert f"#{batch.pk}" in text and "msgbatch_001" in text
    assert "in_progress" in text and "ended" in text


def test_the_batches_command_can_list_without_polling(fake, user):
    batch = agentloop.batch([new_chat(user, "hello")])
    received = len(fake.received)
    out = StringIO()

    call_command("agentloop", "batches", "--no-poll", stdout=out)

    assert len(fake.received) == received
    assert f"#{batch.pk}" in out.getvalue()


def test_the_poll_task_polls_open_batches(fake, user):
    from agentloop.tasks import poll_batches

    chat = new_chat(user, "hello")
    agentloop.batch([chat])

    assert poll_batches() == 1  # the function the worker runs (tests/test_batches_celery.py)
    assert poll_batches() == 1
    assert poll_batches() == 0
    assert transcript(chat)[-1] == ("assistant", "echo: hello")


def test_the_admin_lists_batches_with_status_and_counts(fake, admin_client, user):
    batch = poll_until_collected(agentloop.batch([new_chat(user, "hello"), new_chat(user, "fail")]))

    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get("/admin/agentloop/batch/")
    page = response.content.decode()

    assert response.status_code == 200
    assert "msgbatch_001" in page and "ended" in page
    assert '<td class="field-succeeded_count">1</td>' in page
    assert '<td class="field-failed_count">1</td>' in page
    first = len(queries)
    poll_until_collected(agentloop.batch([new_chat(user, "again")]))
    with CaptureQueriesContext(connection) as queries:
        admin_client.get("/admin/agentloop/batch/")
    assert len(queries) == first  # one more batch, no more queries
    detail = admin_client.get(f"/admin/agentloop/batch/{batch.pk}/change/")
    assert detail.status_code == 200
    assert "scripted failure" in detail.content.decode()


# -- the next round, when the provider won't take it ---------------------------------------------
def first_round_in(fake, user, failure):
    """A chat through its first round, the next batch's submission answered with ``failure``."""
    chat = new_chat(user, "tools:step_one go", step_one)
    first = agentloop.batch([chat], auto_continue=True)
    refresh_batch(first)  # in progress
    fake.before_results = lambda: fake.failures.append(failure)  # hits the next request
    refresh_batch(first)  # ended: answer in, tool run, next batch refused
    fake.before_results = None
    return chat, Batch.objects.get(previous=first)


def test_a_next_round_the_provider_is_too_busy_for_is_sent_by_the_next_poll(fake, user):
    chat, second = first_round_in(fake, user, 503)

    assert second.status == BatchStatus.CREATED and second.provider_batch_id == ""
    assert "Not sent yet: ServerError" in second.error
    refresh_batch(second)  # the poller sends it

    second.refresh_from_db()
    assert second.status == BatchStatus.IN_PROGRESS and second.submitted_at is not None
    poll_until_collected(second)
    assert transcript(chat)[-1] == ("assistant", "done: one done")


def test_a_next_round_the_provider_refuses_fails_its_chats(fake, user):
    chat, second = first_round_in(fake, user, 400)

    assert second.status == BatchStatus.FAILED and second.collected_at is not None
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert f"Batch #{second.pk} could not be sent: BadRequestError" in chat.error
    assert transcript(chat)[-1] == ("tool", "one done")  # awaiting the model: it can go on


class Interrupted(BaseException):
    """Like KeyboardInterrupt: the sender stops between recording the batch and sending it."""


def interrupt(*args):
    raise Interrupted


def test_a_batch_recorded_but_not_sent_is_sent_by_a_poll(fake, user, monkeypatch):
    from agentloop import batches
    from agentloop.batches import submitting

    ready, cancelled, moved_on = new_chat(user, "a"), new_chat(user, "b"), new_chat(user, "c")
    monkeypatch.setattr(submitting, "_send", interrupt)
    with pytest.raises(Interrupted):
        agentloop.batch([ready, cancelled, moved_on])
    monkeypatch.undo()
    batch = Batch.objects.get()
    assert batch.status == BatchStatus.CREATED and fake.received == []
    cancelled.cancel()
    moved_on.ask_later("and another thing")

    batches.poll()

    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS
    assert [item["custom_id"] for item in fake.submitted()[0]] == ["0"]  # only the ready chat
    assert list(batch.items.values_list("status", flat=True)) == [
        BatchItemStatus.PENDING,
        BatchItemStatus.CANCELLED,
        BatchItemStatus.DISCARDED,
    ]
    cancelled.refresh_from_db()
    assert cancelled.cancel_requested_at is None
    poll_until_collected(batch)
    assert transcript(ready)[-1] == ("assistant", "echo: a")
