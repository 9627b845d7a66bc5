"""The compaction functions over plain transcripts (agentloop.engine.compaction)."""

from __future__ import annotations

from agentloop.engine.compaction import (
    SUMMARY_PREFIX,
    THROUGH,
    estimate_tokens,
    plan,
    reported_since_summary,
    window,
)
from agentloop.messages import Message, MessageStatus, ToolCall


def transcript() -> list[Message]:
    """system, then user / assistant with two tool calls / two results / answer, keyed 1.."""
    rows = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="first question"),
        Message(role="assistant", content="first answer"),
        Message(role="user", content="add twice"),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="a", name="add"), ToolCall(id="b", name="add")],
        ),
        Message(role="tool", content="5", tool_call_id="a", tool_name="add"),
        Message(role="tool", content="7", tool_call_id="b", tool_name="add"),
        Message(role="assistant", content="5 and 7"),
    ]
    for key, row in enumerate(rows, start=1):
        row.key = key
    return rows


def summarised(rows: list[Message], through: int, text: str = "S") -> list[Message]:
    summary = Message(role="summary", content=text, provider_data={THROUGH: through})
    summary.key = len(rows) + 1
    return [*rows, summary]


def test_the_cut_never_keeps_a_tool_result_without_its_call():
    rows = transcript()

    throughs = []
    for keep in range(1, 5):
        todo = plan(rows, keep)
        assert todo is not None
        assert all(m.role != "system" for m in todo.rows)
        throughs.append(todo.through)
        kept = [m for m in rows if m.key > todo.through and m.role != "system"]
        called = {call.id for m in kept for call in m.tool_calls}
        assert all(m.tool_call_id in called for m in kept if m.role == "tool")
    # Keeping 2 or 3 would split the round: the cut moves back before the calling answer.
    assert throughs == [7, 4, 4, 4]


def test_nothing_to_summarise_is_no_plan():
    assert plan(transcript(), 7) is None
    assert plan(transcript()[:2], 1) is None


def test_a_window_holds_the_instructions_the_summary_and_the_rows_after_it():
    rows = summarised(transcript(), through=4)
    rows.append(Message(role="user", content="next", key=10))

    sent = window(rows)

    assert [m.role for m in sent] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert sent[0].content == "Be brief."
    assert sent[1].content == f"{SUMMARY_PREFIX}\n\nS"
    assert [m.key for m in sent[2:]] == [5, 6, 7, 8, 10]


def test_the_latest_summary_wins_and_a_new_plan_starts_after_it():
    rows = summarised(summarised(transcript(), through=3, text="old"), through=5, text="new")

    sent = window(rows)
    todo = plan(rows, 1)

    assert sum(1 for m in sent if m.content.startswith(SUMMARY_PREFIX)) == 1
    assert sent[1].content.endswith("new")
    assert todo is not None and todo.previous == "new"
    assert [m.key for m in todo.rows] == [6, 7]


def test_without_a_summary_the_window_is_every_finished_message():
    rows = transcript()
    rows.append(Message(role="assistant", content="cut", status=MessageStatus.CANCELLED))

    assert window(rows) == rows[:-1]


def test_the_estimate_adds_the_rows_since_the_reported_answer():
    rows = transcript()
    since = len("5 and 7")

    assert estimate_tokens(rows, (8, 1000)) == 1000 + since // 4
    # Text, plus each call's name and JSON arguments ("add" and "{}": 5 characters each).
    characters = sum(len(m.content) for m in rows) + 2 * 5
    assert estimate_tokens(rows, None) == characters // 4
    assert estimate_tokens(rows, ("not in the window", 1000)) == characters // 4


def test_a_count_reported_before_the_latest_summary_is_not_used():
    rows = summarised(transcript(), through=4)

    assert not reported_since_summary(rows, 8)
    rows.append(Message(role="assistant", content="after", key=20))
    assert reported_since_summary(rows, 20)
    assert reported_since_summary(transcript(), 8)
