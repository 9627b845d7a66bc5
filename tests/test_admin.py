"""The chat admin: a timeline change page, filters, actions, permissions, and query counts.

Query counts (superuser, Django test client; the same on SQLite and PostgreSQL):

  changelist   session, user, COUNT of the filtered chats, the page of rows (owner
               joined; message count, last activity, cost and what it waits for as
               subqueries), the date hierarchy's first/last date and its distinct days,
               the model filter's distinct models                                   = 7
               + 1 with ?owner=<id> (that owner's name for the filter)
  change page  session, user, the chat (owner, parent and parent call joined),
               messages, usage grouped by message, tool calls (decider and subagent
               chat joined), the owner widget's user                                = 7
               (+ the chat's content type, once per process: warmed up first)

Neither grows with the number of chats or the length of the transcript.
"""

from __future__ import annotations

import html
import itertools
from decimal import Decimal

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agentloop.admin.actions import DEFAULT_DENY_REASON
from agentloop.admin.timeline import format_cost
from agentloop.exceptions import CancelledError, LimitReachedError
from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, ChatState, Message, ToolCall, Usage
from agentloop.testing import reply, stream, tool_call
from tests.tools import add, ask_manager, explode, refuse, transfer

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/agentloop/chat/"
CHANGELIST_QUERIES = 7
CHANGE_PAGE_QUERIES = 7
MODELS = ["openai:gpt-4.1-mini", "anthropic:claude-haiku-4-5", "demo:rule-based"]


def change_url(chat):
    return reverse("admin:agentloop_chat_change", args=[chat.pk])


def decide_url(chat, call):
    return reverse("admin:agentloop_chat_decide", args=[chat.pk, call.pk])


def count_queries(client, url):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries), response


def page(client, chat):
    response = client.get(change_url(chat))
    assert response.status_code == 200
    return response.content.decode()


# -- building data in bulk ------------------------------------------------------------------
def add_chats(count, owners, start=0):
    """``count`` chats (numbered from ``start``) cycling through owners, models and states,
    each with a user question, an answer that asked for a tool, its result, one usage row,
    and (every seventh) a call waiting for approval. Written in bulk."""
    numbers = range(start, start + count)
    chats = Chat.objects.bulk_create(
        Chat(
            title=f"chat {number}",
            owner=owners[number % len(owners)],
            model=MODELS[number % len(MODELS)],
            state=ChatState.WAITING if number % 7 == 0 else ChatState.IDLE,
        )
        for number in numbers
    )
    messages = Message.objects.bulk_create(
        itertools.chain.from_iterable(
            (
                Message(chat=chat, role="user", content="What is 2 + 3?"),
                Message(chat=chat, role="assistant", content="", finish_reason="tool_calls"),
            )
            for chat in chats
        )
    )
    calls = ToolCall.objects.bulk_create(
        ToolCall(
            chat=chat,
            message=messages[2 * index + 1],
            call_id=f"call_{number}",
            name="transfer" if number % 7 == 0 else "add",
            arguments={"a": 2, "b": 3},
            state=ToolCallState.WAITING if number % 7 == 0 else ToolCallState.SUCCEEDED,
            wait_reason="approval" if number % 7 == 0 else "",
        )
        for index, (number, chat) in enumerate(zip(numbers, chats, strict=True))
    )
    Message.objects.bulk_create(
        Message(chat=call.chat, role="tool", content="5", tool_call=call)
        for call in calls
        if call.state == ToolCallState.SUCCEEDED
    )
    Usage.objects.bulk_create(
        Usage(
            chat=chat,
            owner=chat.owner,
            model=chat.model,
            status="succeeded",
            input_tokens=12,
            output_tokens=3,
            cost=Decimal("0.0001"),
        )
        for chat in chats
    )
    return chats


@pytest.fixture
def owners(django_user_model):
    return django_user_model.objects.bulk_create(
        django_user_model(username=f"owner{index}") for index in range(25)
    )


def build_transcript(chat, rounds, decider):
    """``rounds`` rounds of five messages: a question, an answer asking for two tools (one
    approved by ``decider``, one handing its task to a subagent chat), their two results (one
    an error with a traceback on its call) and a final answer; usage on both answers."""
    messages = []
    for turn in range(rounds):
        messages += [
            Message(chat=chat, role="user", content=f"question {turn}"),
            Message(chat=chat, role="assistant", content="", model="scripted:test"),
            Message(chat=chat, role="assistant", content=f"answer {turn}", model="scripted:test"),
        ]
    Message.objects.bulk_create(messages)
    calls = []
    for turn in range(rounds):
        asking = messages[turn * 3 + 1]
        calls += [
            ToolCall(chat=chat, message=asking, call_id=f"t{turn}a", name="transfer",
                     arguments={"amount": turn, "to": "bob"}, state=ToolCallState.SUCCEEDED,
                     decision="approved", decided_by=decider, decided_at=timezone.now()),
            ToolCall(chat=chat, message=asking, call_id=f"t{turn}b", name="research",
                     arguments={"task": f"look up {turn}"}, state=ToolCallState.FAILED,
                     error="Traceback (most recent call last):\nRuntimeError: kaboom"),
        ]  # fmt: skip
    ToolCall.objects.bulk_create(calls)
    Chat.objects.bulk_create(
        Chat(title=f"research {call.call_id}", parent=chat, parent_tool_call=call)
        for call in calls
        if call.name == "research"
    )
    results = Message.objects.bulk_create(
        Message(
            chat=chat,
            role="tool",
            content=f"result of {call.call_id}",
            tool_call=call,
            is_error=call.state == ToolCallState.FAILED,
        )
        for call in calls
    )
    Usage.objects.bulk_create(
        Usage(
            chat=chat,
            message=message,
            model="scripted:test",
            status="succeeded",
            input_tokens=20,
            output_tokens=5,
            cost=Decimal("0.00002"),
        )
        for message in messages
        if message.role == "assistant"
    )
    return len(messages) + len(results)


def copy_chats(count, owners, start):
    """As ``add_chats(count, owners, start)``, in one INSERT ... SELECT per table: each new chat
    and its rows are copies of the first chat of its kind that ``add_chats`` made (chat 0,
    waiting for approval, or chat 1), with its own number, owner and model. The database
    writes the rows (58,000 of them for 9,990 chats, a second where the ORM's bulk_create
    took ten)."""
    waiting, idle = (Chat.objects.get(title=f"chat {number}").pk for number in (0, 1))
    last = start + count - 1

    def columns(table_of, /, **computed):
        """The model's columns but its key, and the SQL that fills each in the copy."""
        names = [field.column for field in table_of._meta.concrete_fields if not field.primary_key]
        return ", ".join(names), ", ".join(computed.get(name, f"old.{name}") for name in names)

    def cases(expression, values):
        whens = " ".join(f"WHEN {index} THEN {value}" for index, value in enumerate(values))
        return f"CASE {expression} {whens} END"

    number = "SUBSTR(new.title, 6)"  # '123' of 'chat 123'
    template = f"CASE WHEN new.state = '{ChatState.WAITING}' THEN {waiting} ELSE {idle} END"
    # the chats this call makes: after the last one of the chats before them
    fresh = f"new.id > (SELECT MAX(id) FROM {Chat._meta.db_table} WHERE title = 'chat {start - 1}')"
    chat_columns, chat_values = columns(
        Chat,
        title="'chat ' || n",
        owner_id=cases(f"n % {len(owners)}", [owner.pk for owner in owners]),
        model=cases(f"n % {len(MODELS)}", [f"'{model}'" for model in MODELS]),
        state=f"CASE WHEN n % 7 = 0 THEN '{ChatState.WAITING}' ELSE '{ChatState.IDLE}' END",
    )
    message_table, call_table = Message._meta.db_table, ToolCall._meta.db_table
    asking = f"(SELECT id FROM {message_table} WHERE chat_id = new.id AND role = 'assistant')"
    statements = [
        f"WITH RECURSIVE numbers(n) AS (SELECT {start} UNION ALL SELECT n + 1 FROM numbers "
        f"WHERE n < {last}) INSERT INTO {Chat._meta.db_table} ({chat_columns}) SELECT "
        f"{chat_values} FROM numbers, {Chat._meta.db_table} old WHERE old.id = CASE WHEN "
        f"n % 7 = 0 THEN {waiting} ELSE {idle} END ORDER BY n",
        # the question and the answer that asked for the tool, then the call, then its result
        "INSERT INTO {table} ({0}) SELECT {1} FROM {chats} new, {table} old WHERE {fresh} AND "
        "old.chat_id = {template} AND old.tool_call_id IS NULL ORDER BY new.id, old.id".format(
            *columns(Message, chat_id="new.id"), table=message_table,
            chats=Chat._meta.db_table, fresh=fresh, template=template,
        ),
        "INSERT INTO {table} ({0}) SELECT {1} FROM {chats} new, {table} old WHERE {fresh} AND "
        "old.chat_id = {template} ORDER BY new.id".format(
            *columns(ToolCall, chat_id="new.id", message_id=asking,
                     call_id=f"'call_' || {number}"),
            table=call_table, chats=Chat._meta.db_table, fresh=fresh, template=template,
        ),
        "INSERT INTO {table} ({0}) SELECT {1} FROM {chats} new, {table} old WHERE {fresh} AND "
        "old.chat_id = {template} AND old.tool_call_id IS NOT NULL ORDER BY new.id".format(
            *columns(Message, chat_id="new.id", tool_call_id=(
                f"(SELECT id FROM {call_table} WHERE chat_id = new.id)")),
            table=message_table, chats=Chat._meta.db_table, fresh=fresh, template=template,
        ),
        "INSERT INTO {table} ({0}) SELECT {1} FROM {chats} new, {table} old WHERE {fresh} AND "
        "old.chat_id = {template} ORDER BY new.id".format(
            *columns(Usage, chat_id="new.id", owner_id="new.owner_id", model="new.model"),
            table=Usage._meta.db_table, chats=Chat._meta.db_table, fresh=fresh,
            template=template,
        ),
    ]  # fmt: skip
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


# -- queries at scale -------------------------------------------------------------------------
def test_the_changelist_costs_the_same_queries_for_10_and_10000_chats(admin_client, owners):
    """Plain, and with every filter and a search applied (10,000 chats are built once)."""
    filtered = f"{CHANGELIST}?state=waiting&waiting_for=approval&owner={owners[0].pk}&q=chat"
    add_chats(10, owners)
    small = [count_queries(admin_client, url)[0] for url in (CHANGELIST, filtered)]

    copy_chats(9990, owners, start=10)
    large, response = count_queries(admin_client, CHANGELIST)
    large_filtered, filtered_response = count_queries(admin_client, filtered)

    expected = [CHANGELIST_QUERIES, CHANGELIST_QUERIES + 1]
    assert (small, [large, large_filtered]) == (expected, expected)
    rows = response.context["cl"].result_list
    assert len(rows) == 100
    assert response.context["cl"].result_count == 10000
    assert {row.message_count for row in rows} <= {2, 3}
    # Every 7th chat waits for approval; owner 0 has every 25th: every 175th chat.
    assert filtered_response.context["cl"].result_count == len(range(0, 10000, 175))


def test_the_change_page_costs_the_same_queries_for_10_and_500_messages(admin_client, admin_user):
    short = Chat.objects.create(title="short", owner=admin_user, model="scripted:test")
    long = Chat.objects.create(title="long", owner=admin_user, model="scripted:test")
    assert build_transcript(short, 2, admin_user) == 10
    assert build_transcript(long, 100, admin_user) == 500

    admin_client.get(change_url(short))  # warm the per-process content type cache
    short_queries, _ = count_queries(admin_client, change_url(short))
    long_queries, response = count_queries(admin_client, change_url(long))

    assert (short_queries, long_queries) == (CHANGE_PAGE_QUERIES, CHANGE_PAGE_QUERIES)
    content = response.content.decode()
    assert content.count('class="agentloop-call ') == 200
    assert "result of t99b" in content
    assert "500 messages" in content


# -- the timeline ----------------------------------------------------------------------------
@pytest.fixture
def chat(user):
    return Chat.objects.create(owner=user, model="scripted:test", title="Payments")


def test_the_timeline_shows_the_tool_call_its_arguments_and_result(admin_client, chat, scripted):
    chat.with_instructions("You add numbers.").with_tools(add)
    scripted.add(tool_call("add", {"a": 2, "b": 3}), "2 + 3 = 5")
    chat.ask("What is 2 + 3?")

    content = page(admin_client, chat)

    for text in ["You add numbers.", "What is 2 + 3?", "2 + 3 = 5"]:
        assert text in content
    assert '<code class="agentloop-tool-name">add</code>' in content
    assert html.escape('{\n  "a": 2,\n  "b": 3\n}') in content
    assert "<pre>5</pre>" in content
    # In order: the question, the call, its result, the answer.
    in_order = ["What is 2 + 3?", "agentloop-tool-name", "<pre>5</pre>", "2 + 3 = 5"]
    positions = [content.index(text) for text in in_order]
    assert positions == sorted(positions)


def test_the_timeline_shows_a_tool_exception_as_an_error_with_its_traceback(
    admin_client, chat, scripted
):
    chat.with_tools(explode)
    scripted.add(tool_call("explode"), "It broke.")
    chat.ask("Explode, please")

    content = page(admin_client, chat)

    assert 'class="agentloop-result agentloop-result-error"' in content
    assert "<summary>exception: RuntimeError: kaboom</summary>" in content
    assert "Traceback (most recent call last)" in content


def test_the_timeline_shows_a_tool_error_result_as_an_error(admin_client, chat, scripted):
    chat.with_tools(refuse)
    scripted.add(tool_call("refuse", {"reason": "no"}), "It refused.")
    chat.ask("Try")

    content = page(admin_client, chat)

    assert "refused: no" in content
    assert "error result" in content


@override_settings(AGENTLOOP={"CANCEL_POLL_INTERVAL": 0})
def test_the_timeline_marks_a_cancelled_partial_answer(admin_client, chat, scripted):
    chat.ask_later("Tell me a story")
    scripted.add(stream("Once ", "upon ", "a ", "time"))
    with pytest.raises(CancelledError):
        chat.generate(stream=lambda chunk: chat.cancel())
    assert chat.messages.get(role="assistant").status == MessageStatus.CANCELLED

    content = page(admin_client, chat)

    assert "agentloop-status-cancelled" in content
    assert "cancelled while streaming" in content
    assert "Once " in content


def test_the_timeline_shows_a_call_waiting_for_approval_with_buttons(admin_client, chat, scripted):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 30, "to": "bob"}))
    chat.ask("Pay Bob 30")
    (waiting,) = chat.pending_approvals()

    content = page(admin_client, chat)

    assert "waiting for approval" in content
    assert "1 tool call waiting for approval" in content
    assert f'formaction="{decide_url(chat, waiting)}"' in content
    assert 'value="approve"' in content and 'value="deny"' in content


def test_the_timeline_shows_a_question_waiting_for_an_answer(admin_client, chat, scripted):
    chat.with_tools(ask_manager)
    scripted.add(tool_call("ask_manager", {"question": "May I refund 500?"}))
    chat.ask("Refund the customer")

    content = page(admin_client, chat)

    assert "waiting for an answer" in content
    assert "May I refund 500?" in content
    assert 'value="answer"' in content


def test_the_timeline_shows_who_approved_a_call_and_when(admin_client, admin_user, chat, scripted):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 30, "to": "bob"}), "Sent.")
    chat.ask("Pay Bob 30")
    (waiting,) = chat.pending_approvals()
    chat.approve(waiting.pk, by=admin_user)
    chat.complete()

    content = page(admin_client, chat)

    call = ToolCall.objects.get()
    assert "approved by admin at" in content
    assert call.decided_at is not None
    assert "sent 30 to bob" in content


def test_the_timeline_links_a_subagent_wait_to_the_child_chat(admin_client, chat):
    asking = Message.objects.create(chat=chat, role="assistant", content="")
    call = ToolCall.objects.create(
        chat=chat, message=asking, call_id="r1", name="research", arguments={"task": "dig"},
        state=ToolCallState.WAITING, wait_reason="subagent",
    )  # fmt: skip
    child = Chat.objects.create(title="Research: dig", parent=chat, parent_tool_call=call)

    content = page(admin_client, chat)

    assert "waiting for its subagent" in content
    assert f'<a href="{change_url(child)}">Research: dig</a>' in content


def test_a_subagent_chat_links_back_to_its_parent(admin_client, chat):
    asking = Message.objects.create(chat=chat, role="assistant", content="")
    call = ToolCall.objects.create(chat=chat, message=asking, call_id="r1", name="research")
    child = Chat.objects.create(title="Research: dig", parent=chat, parent_tool_call=call)

    content = page(admin_client, child)

    assert f'<a href="{change_url(chat)}">Payments</a> (research(r1))' in content


def test_the_timeline_shows_why_a_chat_stopped(admin_client, chat, scripted):
    chat.with_tools(add).with_limits(max_model_calls=1)
    scripted.add(tool_call("add", {"a": 1, "b": 1}))
    with pytest.raises(LimitReachedError):
        chat.ask("1 + 1, then more")
    chat.refresh_from_db()
    assert chat.stop_reason

    content = page(admin_client, chat)

    assert f"Stopped: {html.escape(chat.stop_reason)}" in content


def test_the_timeline_shows_why_a_chat_failed(admin_client, chat):
    Chat.objects.filter(pk=chat.pk).update(
        state=ChatState.FAILED, error="AuthenticationError: 401 invalid api key"
    )

    content = page(admin_client, chat)

    assert "Failed:" in content
    assert "AuthenticationError: 401 invalid api key" in content


def test_the_timeline_shows_usage_totals_and_per_message_usage(admin_client, chat, scripted):
    scripted.add(reply("Hi there"))
    chat.ask("Hello")
    Usage.objects.filter(chat=chat).update(input_tokens=1200, output_tokens=34, cost="0.0042")
    Usage.objects.create(chat=chat, model="scripted:test", status="failed", input_tokens=0)

    content = page(admin_client, chat)

    assert "2 model calls" in content
    assert "(1 failed)" in content
    assert "1200 input / 34 output tokens" in content
    assert "cost $0.0042" in content
    assert "1200 in / 34 out &middot; $0.0042" in content


def test_cost_is_shown_to_the_micro_dollar_and_unknown_as_a_dash():
    assert format_cost(Decimal("0.00420000")) == "$0.0042"
    assert format_cost(Decimal("12.5")) == "$12.5"
    assert format_cost(None) == "—"


def test_config_fields_are_in_a_collapsed_fieldset(admin_client, chat):
    content = page(admin_client, chat)

    configuration = content.index(">Configuration</h2>")
    assert content.rindex("<details>", 0, configuration) > content.index("agentloop-timeline")
    assert 'name="provider_options"' in content


def test_the_change_form_still_saves_the_chat(admin_client, chat):
    form = admin_client.get(change_url(chat)).context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = field.prepare_value(form[name].value())
        data[name] = "" if value is None else value

    response = admin_client.post(change_url(chat), {**data, "title": "Renamed"})

    assert response.status_code == 302
    chat.refresh_from_db()
    assert chat.title == "Renamed"


def test_the_add_page_has_no_timeline(admin_client):
    response = admin_client.get("/admin/agentloop/chat/add/")

    assert response.status_code == 200
    assert "agentloop-timeline" not in response.content.decode()


# -- list columns and filters ---------------------------------------------------------------
def titles(response):
    return sorted(row.title for row in response.context["cl"].result_list)


def test_the_list_shows_owner_model_state_waiting_messages_and_cost(admin_client, owners):
    add_chats(1, owners)

    content = admin_client.get(CHANGELIST).content.decode()

    for text in [
        '<span class="agentloop-cut" title="chat 0">chat 0</span>',
        f'<a class="agentloop-cut" href="?owner={owners[0].pk}" title="owner0">owner0</a>',
        f'<span class="agentloop-cut agentloop-quiet" title="{MODELS[0]}">{MODELS[0]}</span>',
        '<span class="agentloop-badge agentloop-state-waiting">waiting</span>',
        '<span class="agentloop-cut agentloop-quiet" title="waiting for approval">'
        "for approval</span>",
        '<span class="agentloop-quiet">2 messages</span>',
        '<td class="field-cost">$0.0001</td>',
    ]:
        assert text in content


def test_a_chat_on_the_default_model_shows_that_model_not_a_dash(admin_client, settings):
    settings.AGENTLOOP = {"DEFAULT_MODEL": "openai:gpt-default"}
    Chat.objects.create(title="on the default", model="")

    content = admin_client.get(CHANGELIST).content.decode()

    assert (
        '<span class="agentloop-cut agentloop-quiet" title="openai:gpt-default (default)">'
        "openai:gpt-default</span>"
    ) in content
    chat_cell = content.split('class="field-chat"', 1)[1].split("</t", 1)[0]
    assert "—" not in chat_cell


def test_the_model_filter_offers_the_default_model_and_keeps_its_chats(admin_client, settings):
    settings.AGENTLOOP = {"DEFAULT_MODEL": "openai:gpt-default"}
    Chat.objects.create(title="stored nothing", model="")
    Chat.objects.create(title="named the default", model="openai:gpt-default")
    Chat.objects.create(title="another", model="anthropic:claude-x")

    response = admin_client.get(CHANGELIST)
    (model_filter,) = [f for f in response.context["cl"].filter_specs if f.title == "model"]
    choices = [
        (c["display"], c["query_string"]) for c in model_filter.choices(response.context["cl"])
    ]

    assert [display for display, _ in choices] == [
        "All", "anthropic:claude-x", "openai:gpt-default (default)",
    ]  # fmt: skip
    assert titles(admin_client.get(f"{CHANGELIST}?model=openai:gpt-default")) == [
        "named the default", "stored nothing",
    ]  # fmt: skip
    assert titles(admin_client.get(f"{CHANGELIST}?model=anthropic:claude-x")) == ["another"]


def test_the_waiting_filter_keeps_chats_with_a_call_waiting_for_that(admin_client, owners):
    add_chats(8, owners)

    response = admin_client.get(f"{CHANGELIST}?waiting_for=approval")

    assert titles(response) == ["chat 0", "chat 7"]
    assert titles(admin_client.get(f"{CHANGELIST}?waiting_for=question")) == []


def test_the_waiting_filter_finds_a_chat_run_in_process_that_waits(admin_client, chat, scripted):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 30, "to": "bob"}))
    chat.ask("Pay Bob 30")

    assert titles(admin_client.get(f"{CHANGELIST}?waiting_for=any")) == ["Payments"]


def test_the_owner_filter_keeps_one_owners_chats_and_names_them(admin_client, owners):
    add_chats(30, owners)

    response = admin_client.get(f"{CHANGELIST}?owner={owners[3].pk}")

    assert titles(response) == ["chat 28", "chat 3"]
    assert "owner3" in response.content.decode()


def test_the_mine_filter_keeps_the_current_users_chats(admin_client, admin_user, owners):
    add_chats(3, owners)
    Chat.objects.create(title="my own", owner=admin_user)

    assert titles(admin_client.get(f"{CHANGELIST}?owner=mine")) == ["my own"]


def test_the_problem_filter_finds_failed_stopped_tool_failures_and_cancels(admin_client, user):
    failed = Chat.objects.create(title="failed", state=ChatState.FAILED, error="401")
    Chat.objects.create(title="stopped", state=ChatState.STOPPED, stop_reason="limit")
    tool_failed = Chat.objects.create(title="tool failed")
    asking = Message.objects.create(chat=tool_failed, role="assistant")
    ToolCall.objects.create(chat=tool_failed, message=asking, call_id="x", name="explode",
                            state=ToolCallState.FAILED)  # fmt: skip
    cancelled = Chat.objects.create(title="cancelled")
    Message.objects.create(chat=cancelled, role="assistant", status=MessageStatus.CANCELLED)
    Chat.objects.create(title="fine")

    found = {
        value: titles(admin_client.get(f"{CHANGELIST}?problem={value}"))
        for value in ["failed", "stopped", "tool_failed", "cancelled"]
    }

    assert found == {
        "failed": [failed.title],
        "stopped": ["stopped"],
        "tool_failed": ["tool failed"],
        "cancelled": ["cancelled"],
    }


def test_search_finds_chats_by_owner_username(admin_client, owners):
    add_chats(30, owners)

    assert titles(admin_client.get(f"{CHANGELIST}?q=owner4")) == ["chat 29", "chat 4"]


def test_an_owner_filter_that_is_not_an_id_is_a_lookup_error(admin_client):
    response = admin_client.get(f"{CHANGELIST}?owner=abc")

    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


# -- actions --------------------------------------------------------------------------------
def run_action(client, action, chats):
    return client.post(
        CHANGELIST, {"action": action, "_selected_action": [chat.pk for chat in chats]}
    )


def test_the_cancel_action_sets_the_flag(admin_client, chat):
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.RUNNING)
    response = run_action(admin_client, "cancel_chats", [chat])

    assert response.status_code == 302
    chat.refresh_from_db()
    assert chat.cancel_requested_at is not None


def test_the_resume_action_queues_the_chat(admin_client, chat):
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.FAILED, error="timeout")

    run_action(admin_client, "resume_chats", [chat])

    chat.refresh_from_db()
    assert (chat.state, chat.error) == (ChatState.QUEUED, "")


@pytest.fixture
def waiting_chats(user, scripted):
    chats = []
    for amount in (10, 20):
        chat = Chat.objects.create(owner=user, model="scripted:test", title=f"pay {amount}")
        chat.with_tools(transfer)
        scripted.add(tool_call("transfer", {"amount": amount, "to": "bob"}))
        chat.ask(f"Pay Bob {amount}")
        chats.append(chat)
    return chats


def test_the_approve_action_approves_waiting_calls_as_the_admin(
    admin_client, admin_user, waiting_chats
):
    run_action(admin_client, "approve_pending", waiting_chats)

    decisions = list(ToolCall.objects.order_by("id").values_list("decision", "decided_by", "state"))
    assert decisions == [("approved", admin_user.pk, ToolCallState.PENDING)] * 2


def test_the_deny_action_denies_waiting_calls_with_a_default_reason(
    admin_client, admin_user, waiting_chats
):
    run_action(admin_client, "deny_pending", waiting_chats)

    for call in ToolCall.objects.all():
        assert (call.decision, call.decided_by, call.decision_reason) == (
            "denied", admin_user, DEFAULT_DENY_REASON,
        )  # fmt: skip
        assert call.result.is_error
        assert DEFAULT_DENY_REASON in call.result.content


def test_the_approve_action_leaves_chats_with_nothing_waiting_alone(admin_client, chat):
    response = run_action(admin_client, "approve_pending", [chat])

    assert response.status_code == 302
    assert ToolCall.objects.count() == 0


@pytest.mark.parametrize("action", ["cancel_chats", "resume_chats", "approve_pending"])
def test_a_staff_user_without_change_permission_cannot_run_actions(viewer, waiting_chats, action):
    before = list(Chat.objects.order_by("id").values_list("cancel_requested_at", "state"))

    run_action(viewer, action, waiting_chats)

    assert list(Chat.objects.order_by("id").values_list("cancel_requested_at", "state")) == before
    assert set(ToolCall.objects.values_list("decision", flat=True)) == {""}


def test_a_staff_user_without_change_permission_sees_no_actions_or_buttons(viewer, waiting_chats):
    listing = viewer.get(CHANGELIST)
    content = viewer.get(change_url(waiting_chats[0])).content.decode()

    assert listing.status_code == 200
    assert "approve_pending" not in listing.content.decode()
    assert "waiting for approval" in content
    assert 'value="approve"' not in content


# -- deciding one call from the timeline ------------------------------------------------------
def test_approving_from_the_timeline_records_the_admin(admin_client, admin_user, waiting_chats):
    chat = waiting_chats[0]
    (call,) = chat.pending_approvals()

    response = admin_client.post(decide_url(chat, call), {"decision": "approve"})

    assert response.status_code == 302
    assert response["Location"] == f"{change_url(chat)}#call-{call.pk}"
    call.refresh_from_db()
    assert (call.decision, call.decided_by) == ("approved", admin_user)


def test_denying_from_the_timeline_gives_the_typed_reason(admin_client, waiting_chats):
    chat = waiting_chats[0]
    (call,) = chat.pending_approvals()

    admin_client.post(
        decide_url(chat, call), {"decision": "deny", f"reason-{call.pk}": "Bob was paid"}
    )

    call.refresh_from_db()
    assert (call.decision, call.decision_reason) == ("denied", "Bob was paid")


def test_answering_from_the_timeline_makes_the_answer_the_result(admin_client, chat, scripted):
    chat.with_tools(ask_manager)
    scripted.add(tool_call("ask_manager", {"question": "May I refund 500?"}))
    chat.ask("Refund the customer")
    (call,) = chat.pending_questions()

    admin_client.post(decide_url(chat, call), {"decision": "answer", f"answer-{call.pk}": "Yes"})

    call.refresh_from_db()
    assert (call.decision, call.result.content) == ("answered", "Yes")


def test_deciding_a_call_that_is_not_waiting_says_so(admin_client, waiting_chats):
    chat = waiting_chats[0]
    (call,) = chat.pending_approvals()
    admin_client.post(decide_url(chat, call), {"decision": "approve"})

    response = admin_client.post(decide_url(chat, call), {"decision": "deny"}, follow=True)

    assert "was already approved" in response.content.decode()
    call.refresh_from_db()
    assert call.decision == "approved"


def test_a_staff_user_without_change_permission_cannot_decide(viewer, waiting_chats):
    chat = waiting_chats[0]
    (call,) = chat.pending_approvals()

    response = viewer.post(decide_url(chat, call), {"decision": "approve"})

    assert response.status_code == 403
    call.refresh_from_db()
    assert call.decision == ""


def test_deciding_needs_a_post(admin_client, waiting_chats):
    chat = waiting_chats[0]
    (call,) = chat.pending_approvals()

    assert admin_client.get(decide_url(chat, call)).status_code == 405


def test_the_change_page_shows_who_holds_the_chat(admin_client, admin_user):
    chat = Chat.objects.create(owner=admin_user, model="scripted:test")
    Chat.objects.filter(pk=chat.pk).update(
        lease_token="t", lease_holder="worker-7/0badf00d:4242:99", state=ChatState.RUNNING
    )

    content = admin_client.get(change_url(chat)).content.decode()

    assert "Lease holder" in content
    assert "worker-7/0badf00d:4242:99" in content
