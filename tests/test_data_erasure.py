"""Exporting and erasing one owner's data (``agentloop.data``, docs/data-retention.md).

Rows are made with the ORM as a run would leave them; the runs that are still going when an
owner is erased are in tests/test_data_erasure_celery.py (real workers).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from decimal import Decimal

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentloop import data
from agentloop import live_events as events
from agentloop.engine._tool_rounds import DENIED_RESULT
from agentloop.evals.sets import set_from_chats
from agentloop.live_events import chat_key, get_backend
from agentloop.models import (
    Batch,
    BatchItem,
    Budget,
    Chat,
    EvalCase,
    EvalRun,
    Memory,
    Message,
    ToolCall,
    Usage,
)  # fmt: skip
from agentloop.testing import tool_call
from tests.tools import ask_manager, transfer

pytestmark = pytest.mark.django_db

PNG = "iVBORw0KGgo="  # the first bytes of a PNG, in base64


@pytest.fixture
def other(django_user_model):
    return django_user_model.objects.create_user(username="grace", password="pw")


def conversation(owner, *, title="Taxes", messages=2, decided_by=None):
    """A chat with a user message (an image attached), an assistant answer asking for a tool
    (decided by ``decided_by``), its result, a subagent chat, and a usage row for each answer."""
    chat = Chat.objects.create(model="openai:gpt-4.1-mini", owner=owner, title=title)
    Message.objects.create(
        chat=chat,
        role="user",
        content="What do I owe?",
        attachments=[{"kind": "image", "data": PNG, "media_type": "image/png", "name": "a.png"}],
    )
    answer = Message.objects.create(chat=chat, role="assistant", model="gpt-4.1-mini")
    call = ToolCall.objects.create(
        chat=chat,
        message=answer,
        call_id="call_1",
        name="pay",
        arguments={"amount": 42},
        state="succeeded",
        decision="approved" if decided_by else "",
        decided_by=decided_by,
    )
    Message.objects.create(chat=chat, role="tool", content="paid", tool_call=call)
    for number in range(messages - 2):
        Message.objects.create(chat=chat, role="assistant", content=f"more {number}")
    Usage.objects.create(
        chat=chat, message=answer, owner=owner, model="gpt-4.1-mini", provider="openai",
        status="succeeded", input_tokens=100, output_tokens=20, cost=Decimal("0.0021"),
        error="",
    )  # fmt: skip
    child = Chat.objects.create(
        model="openai:gpt-4.1-mini", owner=owner, parent=chat, parent_tool_call=call
    )
    Message.objects.create(chat=child, role="user", content="Work out the taxes")
    Usage.objects.create(
        chat=child, owner=owner, model="gpt-4.1-mini", provider="openai", status="failed",
        input_tokens=5, error="400: the message 'What do I owe?' is too long",
    )  # fmt: skip
    return chat, child


# -- export ------------------------------------------------------------------------------------
def test_the_export_holds_every_chat_message_tool_call_decision_and_usage_row(user, other):
    chat, child = conversation(user, decided_by=user)
    theirs, _ = conversation(other, title="Grace's", decided_by=user)

    document = data.export_owner(user)

    assert (document["format"], document["version"]) == ("agentloop.owner-export", 1)
    assert document["owner"] == {"id": user.pk, "username": "ada"}
    assert [c["id"] for c in document["chats"]] == [chat.pk, child.pk]
    first = document["chats"][0]
    assert first["title"] == "Taxes"
    assert first["configuration"]["tools"] == []
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool"]
    (call,) = first["messages"][1]["tool_calls"]
    assert (call["name"], call["arguments"], call["decision"], call["decided_by_id"]) == (
        "pay", {"amount": 42}, "approved", user.pk,
    )  # fmt: skip
    assert first["messages"][0]["attachments"][0]["data"] == PNG
    assert document["chats"][1]["parent_id"] == chat.pk
    assert [(u["chat_id"], u["status"]) for u in document["usage"]] == [
        (chat.pk, "succeeded"), (child.pk, "failed"),
    ]  # fmt: skip
    assert document["usage"][0]["cost"] == "0.00210000"
    # The call this owner approved on someone else's chat: the decision, not their chat.
    (decided,) = document["decisions_on_other_chats"]
    assert (decided["chat_id"], decided["decision"]) == (theirs.pk, "approved")
    assert "arguments" not in decided
    assert document["totals"] == {
        "input_tokens": 105, "output_tokens": 20, "cache_read_tokens": 0,
        "cache_write_tokens": 0, "reasoning_tokens": 0, "cost": "0.00210000", "attempts": 2,
        "chats": 2,
    }  # fmt: skip
    json.dumps(document)  # JSON values only


def test_the_export_holds_the_owners_memories_without_their_embeddings(user, other):
    mine = Memory.objects.create(owner=user, subject=f"auth.user:{user.pk}", text="likes tea")
    by_subject = Memory.objects.create(subject=f"auth.user:{user.pk}", text="lives in Oslo")
    Memory.objects.create(owner=other, subject=f"auth.user:{other.pk}", text="not hers")
    Memory.objects.create(subject="teams.team:1", text="the team's")

    document = data.export_owner(user)

    assert [(m["id"], m["text"]) for m in document["memories"]] == [
        (mine.pk, "likes tea"), (by_subject.pk, "lives in Oslo"),
    ]  # fmt: skip
    assert "embedding" not in document["memories"][0]
    assert document["memories"][0]["subject"] == f"auth.user:{user.pk}"
    json.dumps(document)  # JSON values only


def test_the_export_holds_the_eval_copies_of_the_owners_turns_as_erasure_deletes_them(user, other):
    mine, _ = conversation(user)
    theirs, _ = conversation(other)
    eval_set = set_from_chats("support", [mine, theirs])
    run = EvalRun.objects.create(eval_set=eval_set, model="scripted:v2", name="v2")
    for position, (chat, item) in enumerate(zip((mine, theirs), eval_set.items, strict=True)):
        EvalCase.objects.create(
            run=run, position=position, source_chat=chat, item=item, input=item["input"],
            reference=item["reference"], answer=f"candidate {position}", state="failed",
            scores=[{"name": "exact", "score": 0.0, "passed": False, "reason": "differs"}],
            cost=Decimal("0.002"),
        )  # fmt: skip

    document = data.export_owner(user)

    (case,) = document["eval_cases"]
    assert (case["source_chat_id"], case["input"], case["answer"]) == (
        mine.pk, eval_set.items[0]["input"], "candidate 0",
    )  # fmt: skip
    assert (case["run_id"], case["run"], case["model"]) == (run.pk, "v2", "scripted:v2")
    assert Decimal(case["cost"]) == Decimal("0.002")  # a decimal string
    assert case["scores"][0]["reason"] == "differs"
    assert document["eval_set_items"] == [
        {"eval_set_id": eval_set.pk, "eval_set": "support", **{
            key: eval_set.items[0][key] for key in ("chat", "turn", "input", "reference")}}
    ]  # fmt: skip
    out = io.StringIO()
    data.write_export(user, out)
    written = json.loads(out.getvalue())
    assert (written["eval_cases"], written["eval_set_items"]) == (
        document["eval_cases"], document["eval_set_items"],
    )  # fmt: skip
    # What the export shows of them is exactly what erasing the owner deletes.
    report = data.erase_owner(user)
    assert (report.eval_cases_deleted, report.eval_items_removed) == (1, 1)
    assert data.export_owner(other)["eval_cases"][0]["source_chat_id"] == theirs.pk


def test_attachments_can_be_referenced_instead_of_included(user):
    conversation(user)

    document = data.export_owner(user, attachments="reference")

    (attachment,) = document["chats"][0]["messages"][0]["attachments"]
    raw = base64.b64decode(PNG)
    assert attachment == {
        "kind": "image", "media_type": "image/png", "name": "a.png", "url": None,
        "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
    }  # fmt: skip
    with pytest.raises(ValueError, match="'include' or 'reference'"):
        data.export_owner(user, attachments="inline")


def test_the_written_export_is_the_same_document(user):
    conversation(user, decided_by=user)
    Memory.objects.create(owner=user, subject=f"auth.user:{user.pk}", text="likes tea")
    out = io.StringIO()

    data.write_export(user, out)

    written, returned = json.loads(out.getvalue()), data.export_owner(user)
    written["exported_at"] = returned["exported_at"]
    assert written == returned


def test_an_owner_with_nothing_exports_an_empty_document(user):
    out = io.StringIO()
    data.write_export(user, out)
    written = json.loads(out.getvalue())
    assert (written["chats"], written["usage"], written["memories"]) == ([], [], [])
    assert (written["eval_cases"], written["eval_set_items"]) == ([], [])
    assert written["totals"]["attempts"] == 0


def test_the_export_costs_the_same_queries_however_long_the_chats(user):
    def queries(messages: int) -> int:
        Chat.objects.all().delete()
        for _ in range(3):
            conversation(user, messages=messages)
        with CaptureQueriesContext(connection) as captured:
            data.write_export(user, io.StringIO())
        return len(captured)

    assert queries(2) == queries(40)


# -- erasure -------------------------------------------------------------------------------------
def test_erasing_deletes_the_owners_chats_and_keeps_anonymised_usage(user, other):
    chat, child = conversation(user)
    theirs, their_child = conversation(other, title="Grace's")
    erased = [chat.pk, child.pk]

    report = data.erase_owner(user)

    assert not Chat.objects.filter(pk__in=erased).exists()
    assert not Message.objects.filter(chat_id__in=erased).exists()
    assert not ToolCall.objects.filter(chat_id__in=erased).exists()
    assert (report.deleted.chats, report.deleted.messages, report.deleted.tool_calls) == (2, 4, 1)
    kept = Usage.objects.filter(owner=None).order_by("id")
    assert [(u.chat_id, u.message_id, u.error, u.input_tokens, u.status) for u in kept] == [
        (None, None, "", 100, "succeeded"), (None, None, "", 5, "failed"),
    ]  # fmt: skip
    assert report.deleted.usage_anonymised == 2
    # Nobody else's rows moved.
    assert set(Chat.objects.values_list("pk", flat=True)) == {theirs.pk, their_child.pk}
    assert Message.objects.filter(chat__owner=other).count() == 4
    assert Usage.objects.filter(owner=other).count() == 2


def test_erasing_with_delete_usage_leaves_no_usage_row(user):
    conversation(user)
    Usage.objects.create(owner=user, model="m", status="succeeded")  # its chat deleted before

    report = data.erase_owner(user, keep_usage=False)

    assert not Usage.objects.exists()
    assert (report.deleted.usage_deleted, report.usage_without_chat) == (2, 1)


def test_usage_of_chats_deleted_earlier_loses_its_owner_too(user):
    Usage.objects.create(owner=user, model="m", status="succeeded", error="said: my address")

    report = data.erase_owner(user)

    assert list(Usage.objects.values_list("owner_id", "error")) == [(None, "")]
    assert report.usage_without_chat == 1


def test_erasing_leaves_no_row_pointing_at_an_erased_chat(user, admin_user):
    chat, child = conversation(user)
    batch = Batch.objects.create(provider="openai")
    BatchItem.objects.create(batch=batch, chat=chat, custom_id="c1", model="gpt-4.1-mini")
    LogEntry.objects.log_actions(admin_user.pk, [chat], CHANGE, change_message="Approved")

    data.erase_owner(user)

    assert not BatchItem.objects.exists()
    assert Batch.objects.count() == 1  # shared by many chats' requests: kept
    chat_type = ContentType.objects.get_for_model(Chat)
    assert not LogEntry.objects.filter(content_type=chat_type).exists()


def test_decisions_on_other_owners_chats_keep_the_decision_but_not_who_made_it(user, other):
    theirs, _ = conversation(other, decided_by=user)

    report = data.erase_owner(user)

    call = ToolCall.objects.get(chat=theirs)
    assert (call.decision, call.decided_by_id) == ("approved", None)
    assert report.decisions_unattributed == 1


def waiting_on(scripted, owner, *tools_and_calls) -> tuple[Chat, list[ToolCall]]:
    """A chat of ``owner`` stopped at calls waiting for a person (``tool_call(...)`` each)."""
    chat = Chat.objects.create(model="scripted:test", owner=owner).with_tools(transfer, ask_manager)
    scripted.add(list(tools_and_calls))
    chat.ask("Pay Bob")
    return chat, list(ToolCall.objects.filter(chat=chat).order_by("id"))


def test_the_owners_words_on_other_owners_chats_are_erased_the_decisions_kept(
    user, other, scripted
):
    theirs, (pay, ask) = waiting_on(
        scripted, other, tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"),
        tool_call("ask_manager", {"question": "Which account?"}, id="q1"),
    )  # fmt: skip
    theirs.deny(pay.pk, reason="Ada's IBAN is DE89 3704", by=user)
    theirs.answer(ask.pk, "Ada's savings, at 1 Main St", by=user)
    untouched = list(theirs.messages.exclude(role="tool").values_list("pk", "content"))

    report = data.erase_owner(user)

    pay.refresh_from_db()
    ask.refresh_from_db()
    assert (pay.decision, pay.decision_reason, pay.decided_by_id) == ("denied", "[erased]", None)
    assert (ask.decision, ask.decided_by_id) == ("answered", None)
    results = dict(theirs.messages.filter(role="tool").values_list("tool_call_id", "content"))
    assert results == {
        pay.pk: f"{DENIED_RESULT} Reason: [erased]",
        ask.pk: "[erased]",
    }
    # Nothing else of their chat changed.
    assert list(theirs.messages.exclude(role="tool").values_list("pk", "content")) == untouched
    assert (report.decisions_unattributed, report.words_erased) == (2, 2)
    assert "2 with their words erased" in str(report)


def test_the_words_of_another_decider_stay(user, other, scripted, django_user_model):
    carol = django_user_model.objects.create_user(username="carol")
    theirs, (pay,) = waiting_on(scripted, other, tool_call("transfer", {"amount": 5, "to": "b"}))
    theirs.deny(pay.pk, reason="Carol says no", by=carol)

    data.erase_owner(user)

    pay.refresh_from_db()
    assert (pay.decision_reason, pay.decided_by_id) == ("Carol says no", carol.pk)
    assert theirs.messages.get(role="tool").content.endswith("Reason: Carol says no")


def test_the_erased_words_leave_the_other_chats_event_stream(user, other, scripted, redis_events):
    theirs, (pay,) = waiting_on(scripted, other, tool_call("transfer", {"amount": 5, "to": "b"}))
    theirs.deny(pay.pk, reason="Ada's IBAN is DE89 3704", by=user)
    assert events.flush()
    stream = get_backend().stream(chat_key(theirs))
    before = redis_events.xrange(stream)
    assert any(b"DE89 3704" in fields[b"event"] for _, fields in before)

    data.erase_owner(user)

    after = redis_events.xrange(stream)
    assert not any(b"DE89 3704" in fields[b"event"] for _, fields in after)
    # Only the denial's result went: the chat's other events stay for its pages.
    assert len(after) == len(before) - 1


def test_erasing_deletes_the_owners_budget_row_only(user, other):
    for person in (user, other):
        Budget.objects.create(
            subject=f"auth.user:{person.pk}", label=f"owner {person.pk}",
            cost_per_day=Decimal("5.00"), day_cost=12_000_000,
        )  # fmt: skip
    Budget.objects.create(subject="teams.team:1", label="team 1")  # not the owner's own

    report = data.erase_owner(user)

    assert sorted(Budget.objects.values_list("subject", flat=True)) == [
        f"auth.user:{other.pk}", "teams.team:1",
    ]  # fmt: skip
    assert report.budgets_deleted == 1


def test_erasing_deletes_the_owners_memories_only(user, other):
    for person in (user, other):
        Memory.objects.create(owner=person, subject=f"auth.user:{person.pk}", text="likes tea")
    Memory.objects.create(subject=f"auth.user:{user.pk}", text="by subject, no owner")
    Memory.objects.create(subject="teams.team:1", text="the team's")  # not the owner's own

    report = data.erase_owner(user)

    assert sorted(Memory.objects.values_list("subject", flat=True)) == [
        f"auth.user:{other.pk}", "teams.team:1",
    ]  # fmt: skip
    assert report.memories_deleted == 2


def test_erasing_deletes_the_eval_copies_of_the_owners_turns_only(user, other):
    mine, _ = conversation(user)
    theirs, _ = conversation(other)
    eval_set = set_from_chats("support", [mine, theirs])
    run = EvalRun.objects.create(eval_set=eval_set, model="scripted:test")
    for position, (chat, item) in enumerate(zip((mine, theirs), eval_set.items, strict=True)):
        EvalCase.objects.create(
            run=run, position=position, source_chat=chat, item=item, input=item["input"]
        )

    report = data.erase_owner(user)

    eval_set.refresh_from_db()
    assert [item["chat"] for item in eval_set.items] == [theirs.pk]
    assert list(run.cases.values_list("source_chat_id", flat=True)) == [theirs.pk]
    assert (report.eval_cases_deleted, report.eval_items_removed) == (1, 1)
    assert "1 eval cases deleted; 1 eval set items removed" in str(report)


def test_erasing_a_waiting_chat_cancels_its_run_first(user):
    chat, _ = conversation(user)
    answer = chat.messages.get(role="assistant")
    ToolCall.objects.create(
        chat=chat, message=answer, call_id="call_2", name="refund", state="waiting",
        wait_reason="approval",
    )  # fmt: skip
    Chat.objects.filter(pk=chat.pk).update(state="waiting")

    report = data.erase_owner(user, wait=0)

    assert (report.cancelled, report.fenced) == (1, 0)
    assert not Chat.objects.filter(owner=user).exists()


def test_erasing_twice_finds_nothing_the_second_time(user):
    conversation(user)
    data.erase_owner(user)

    again = data.erase_owner(user.pk)

    assert (again.deleted.chats, again.deleted.messages, again.usage_without_chat) == (0, 0, 0)


def test_erasing_an_owner_of_none_is_a_clear_error():
    with pytest.raises(ValueError, match="owner must be a user"):
        data.erase_owner(None)


# -- event streams ---------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)  # the tombstones are put after the commit
def test_the_erased_chats_event_streams_are_gone_and_cant_come_back(user, redis_events):
    chat, child = conversation(user)
    backend = get_backend()
    for made in (chat, child):
        backend.publish(chat_key(made), "message", {"id": 1, "content": "What do I owe?"})
    streams = [backend.stream(chat_key(made)) for made in (chat, child)]
    assert [redis_events.type(s) for s in streams] == [b"stream", b"stream"]

    data.erase_owner(user)

    assert [redis_events.type(s) for s in streams] == [b"string", b"string"]  # tombstones
    assert all(0 < redis_events.ttl(s) <= 2 * 30 + 60 for s in streams)
    # A worker that still had an event queued for the chat can't bring its stream back.
    with pytest.raises(Exception, match="WRONGTYPE"):
        backend.publish(chat_key(chat), "chunk", {"text": "you owe"})
    assert redis_events.type(streams[0]) == b"string"
    assert backend.read(chat_key(chat), after=None, timeout=0.01) == []


@pytest.mark.django_db(transaction=True)  # the tombstones are put after the commit
def test_a_reader_still_open_on_an_erased_chat_ends_with_nothing_more(user, redis_events):
    from agentloop.web._live import ChatEventReader, stream

    chat, _ = conversation(user)
    get_backend().publish(chat_key(chat), "message", {"id": 1, "content": "What do I owe?"})
    events = stream(ChatEventReader(chat, after=None))
    opening = next(events) + next(events)  # the retry, then the chat's state and its event
    assert b"What do I owe?" in opening

    data.erase_owner(user)

    assert list(events) == []  # the stream ends at its next look at the chat row


def test_the_event_views_answer_404_for_an_erased_chat(user, client):
    chat, _ = conversation(user)
    client.force_login(user)
    assert client.get(f"/agentloop/usechat/{chat.pk}/messages").status_code == 200

    data.erase_owner(user)

    assert client.get(f"/agentloop/chats/{chat.pk}/events/").status_code == 404
    assert client.get(f"/agentloop/usechat/{chat.pk}/messages").status_code == 404
    assert client.get(f"/agentloop/usechat/{chat.pk}/stream").status_code == 404


# -- the commands ----------------------------------------------------------------------------------
def test_the_export_command_writes_the_document_to_a_file_or_standard_output(user, tmp_path):
    conversation(user)
    target = tmp_path / "ada.json"

    call_command("agentloop", "export", "--owner", str(user.pk), "--output", str(target))
    out = io.StringIO()
    call_command("agentloop", "export", "--owner", "ada", "--attachments", "reference", stdout=out)

    assert json.loads(target.read_text())["owner"]["username"] == "ada"
    printed = json.loads(out.getvalue())
    assert "data" not in printed["chats"][0]["messages"][0]["attachments"][0]


def test_the_commands_refuse_an_unknown_owner_in_one_line():
    with pytest.raises(
        CommandError, match=r"^No user with the primary key or username 'nobody'\.$"
    ):
        call_command("agentloop", "export", "--owner", "nobody")
    with pytest.raises(CommandError, match="No user"):
        call_command("agentloop", "erase", "--owner", "4242", "--yes")


def test_the_erase_command_needs_yes_without_a_terminal(user, monkeypatch):
    conversation(user)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    with pytest.raises(CommandError, match="add --yes"):
        call_command("agentloop", "erase", "--owner", str(user.pk))

    assert Chat.objects.filter(owner=user).count() == 2  # nothing lost


def test_the_erase_command_erases_and_prints_what_it_did(user):
    conversation(user)
    out = io.StringIO()

    call_command("agentloop", "erase", "--owner", "ada", "--yes", "--delete-usage", stdout=out)

    assert out.getvalue().startswith(f"Owner {user.pk}: 2 chats, 4 messages, 1 tool calls")
    assert "2 usage rows deleted" in out.getvalue()
    assert not Usage.objects.exists()
