"""The translation of a chat's events into the AI SDK's UI message stream
(``agentloop.web._ui_protocol``), part by part, and the reading of ``useChat``'s requests.
Pure: no database."""

from __future__ import annotations

import json

from agentloop.web._ui_protocol import (
    DONE,
    HEADERS,
    ChatRequest,
    UIStreamTranslator,
    answer_message_id,
    encode,
    error_line,
    parse_approval_id,
    parse_chat_request,
)


def message(pk, role, content="", **fields):
    data = {"id": pk, "role": role, "content": content, "status": "complete", "is_error": False}
    data.setdefault("tool_call_id", None)
    if role == "assistant":
        data.update(thinking="", tool_calls=[])
    data.update(fields)
    return {"type": "message", "id": str(pk), "data": data}


def chunk(text):
    return {"type": "chunk", "data": {"text": text}}


def call(pk, call_id, name, arguments):
    return {"id": pk, "call_id": call_id, "name": name, "arguments": arguments}


def run(translator, *events):
    parts = []
    for event in events:
        parts += translator.event(event)
    return parts


# -- the wire ----------------------------------------------------------------------------------
def test_a_part_is_one_data_line_of_json_and_the_stream_ends_with_done():
    assert encode({"type": "text-delta", "id": "text-1", "delta": "é\n"}) == (
        b'data: {"type":"text-delta","id":"text-1","delta":"\xc3\xa9\\n"}\n\n'
    )
    assert DONE == b"data: [DONE]\n\n"
    assert HEADERS["x-vercel-ai-ui-message-stream"] == "v1"


def test_the_answer_to_a_user_message_is_named_after_it():
    translator = UIStreamTranslator()
    assert translator.start(answer_message_id(12)) == [{"type": "start", "messageId": "a12"}]
    assert answer_message_id(None) == "a0"


# -- text --------------------------------------------------------------------------------------
def test_streamed_chunks_then_the_saved_answer_make_one_text_part_and_a_step():
    translator = UIStreamTranslator()

    parts = run(
        translator,
        message(1, "user", "Hi"),
        chunk("Hel"),
        chunk("lo"),
        message(2, "assistant", "Hello"),
    )

    assert parts == [
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "Hel"},
        {"type": "text-delta", "id": "text-1", "delta": "lo"},
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
    ]
    assert translator.end("idle") == [{"type": "finish", "finishReason": "stop"}]


def test_partial_answers_of_the_database_backend_send_only_what_grew():
    translator = UIStreamTranslator()

    parts = run(
        translator,
        {"type": "partial", "data": {"id": 2, "content": "Once"}},
        {"type": "partial", "data": {"id": 2, "content": "Once"}},
        {"type": "partial", "data": {"id": 2, "content": "Once upon"}},
        message(2, "assistant", "Once upon a time."),
    )

    assert parts == [
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "Once"},
        {"type": "text-delta", "id": "text-1", "delta": " upon"},
        {"type": "reset-step"},  # the saved text is not what streamed: sent again, whole
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "Once upon a time."},
        {"type": "text-end", "id": "text-2"},
        {"type": "finish-step"},
    ]


def test_an_answer_saved_without_streaming_is_sent_whole_with_its_thinking_first():
    translator = UIStreamTranslator()

    parts = run(translator, message(2, "assistant", "4", thinking="2 + 2 is 4"))

    assert parts == [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "reasoning-1"},
        {"type": "reasoning-delta", "id": "reasoning-1", "delta": "2 + 2 is 4"},
        {"type": "reasoning-end", "id": "reasoning-1"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "4"},
        {"type": "text-end", "id": "text-2"},
        {"type": "finish-step"},
    ]


def test_a_retried_answer_replaces_what_streamed_before_it():
    translator = UIStreamTranslator()

    parts = run(
        translator, chunk("Tim"), chunk("eout"), chunk("Fine"), message(2, "assistant", "Fine")
    )

    assert parts[-5:] == [
        {"type": "reset-step"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "Fine"},
        {"type": "text-end", "id": "text-2"},
        {"type": "finish-step"},
    ]


def test_a_row_read_twice_is_sent_once_and_what_streamed_again_is_dropped():
    translator = UIStreamTranslator()
    run(translator, message(2, "assistant", "Hello"))

    parts = run(translator, chunk("Hello"), message(2, "assistant", "Hello"))

    assert parts == [
        {"type": "start-step"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "Hello"},
        {"type": "reset-step"},
        {"type": "finish-step"},
    ]


# -- tools -------------------------------------------------------------------------------------
def test_a_streamed_tool_call_its_saved_answer_and_its_result():
    translator = UIStreamTranslator()
    saved_call = call(7, "call_1", "add", {"a": 2, "b": 3})

    parts = run(
        translator,
        {"type": "tool_call_delta", "data": {"index": 0, "id": "call_1", "name": "add"}},
        {"type": "tool_call_delta", "data": {"index": 0, "arguments": '{"a": 2, '}},
        {"type": "tool_call_delta", "data": {"index": 0, "arguments": '"b": 3}'}},
        message(3, "assistant", "", tool_calls=[saved_call]),
        message(4, "tool", "5", tool_call_id=7),
    )

    assert parts == [
        {"type": "start-step"},
        {"type": "tool-input-start", "toolCallId": "call_1", "toolName": "add", "dynamic": True},
        {"type": "tool-input-delta", "toolCallId": "call_1", "inputTextDelta": '{"a": 2, '},
        {"type": "tool-input-delta", "toolCallId": "call_1", "inputTextDelta": '"b": 3}'},
        {
            "type": "tool-input-available",
            "toolCallId": "call_1",
            "toolName": "add",
            "input": {"a": 2, "b": 3},
            "dynamic": True,
        },
        {"type": "finish-step"},
        {"type": "tool-output-available", "toolCallId": "call_1", "output": "5"},
    ]


def test_error_results_denials_and_results_of_unknown_calls():
    translator = UIStreamTranslator()
    run(
        translator,
        message(3, "assistant", "", tool_calls=[call(7, "c7", "a", {}), call(8, "c8", "b", {})]),
    )

    parts = run(
        translator,
        message(4, "tool", "boom", tool_call_id=7, is_error=True),
        message(
            5,
            "tool",
            "The user denied this call.",
            tool_call_id=8,
            is_error=True,
            decision="denied",
        ),
        message(6, "tool", "other", tool_call_id=99),
    )

    assert parts == [
        {"type": "tool-output-error", "toolCallId": "c7", "errorText": "boom"},
        {"type": "tool-output-denied", "toolCallId": "c8"},
    ]


# -- people in the loop ------------------------------------------------------------------------
def test_a_call_waiting_for_approval_is_an_approval_request_sent_once():
    translator = UIStreamTranslator()
    run(translator, message(3, "assistant", "", tool_calls=[call(7, "c7", "delete_notes", {})]))
    waiting = [{"id": 7, "wait_reason": "approval", "question": ""}]

    first = translator.pending(waiting)
    again = translator.pending(waiting)

    assert first == [{"type": "tool-approval-request", "approvalId": "7", "toolCallId": "c7"}]
    assert again == []
    assert translator.end("waiting") == [{"type": "finish", "finishReason": "tool-calls"}]


def test_a_question_is_a_data_part_and_a_call_never_shown_is_left_out():
    translator = UIStreamTranslator()
    translator.know(message(3, "assistant", "", tool_calls=[call(7, "c7", "ask", {})])["data"])

    parts = translator.pending(
        [
            {"id": 7, "wait_reason": "question", "question": "Which city?"},
            {"id": 9, "wait_reason": "approval", "question": ""},  # a subagent's
        ]
    )

    assert parts == [
        {
            "type": "data-agentloop-question",
            "id": "question-7",
            "data": {"callId": 7, "toolCallId": "c7", "question": "Which city?"},
        }
    ]


# -- the end of a run --------------------------------------------------------------------------
def test_a_failed_run_ends_with_one_line_of_error():
    translator = UIStreamTranslator()
    run(translator, chunk("Half"))

    parts = translator.end("failed", "ProviderError: 500 from upstream\nTraceback (most recent")

    assert parts == [
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {"type": "error", "errorText": "ProviderError: 500 from upstream"},
    ]
    assert error_line("") == "The chat failed."
    assert len(error_line("x" * 2000)) == 500


def test_a_cancelled_answer_ends_the_stream_with_an_abort_and_metadata():
    translator = UIStreamTranslator()
    run(translator, chunk("Once"), message(2, "assistant", "Once", status="cancelled"))

    assert translator.end("idle") == [
        {"type": "message-metadata", "messageMetadata": {"cancelled": True}},
        {"type": "abort", "reason": "cancelled"},
    ]


def test_a_run_stopped_by_a_limit_says_why_in_the_metadata():
    assert UIStreamTranslator().end("stopped", stop_reason="max_model_calls: 3") == [
        {
            "type": "finish",
            "finishReason": "other",
            "messageMetadata": {"stopReason": "max_model_calls: 3"},
        }
    ]


# -- requests ----------------------------------------------------------------------------------
def request(*messages, **fields):
    return {"id": "5", "messages": list(messages), "trigger": "submit-message", **fields}


def test_only_the_last_user_messages_text_is_taken():
    edited = {"id": "x1", "role": "assistant", "parts": [{"type": "text", "text": "I said yes"}]}
    last = {
        "id": "x2",
        "role": "user",
        "parts": [
            {"type": "text", "text": "Hello "},
            {"type": "file", "url": "data:,"},
            {"type": "text", "text": "you"},
        ],
    }

    assert parse_chat_request(request(edited, last)) == ChatRequest(5, text="Hello you")


def test_approval_responses_of_the_last_message_are_decisions():
    last = {
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "dynamic-tool",
                "state": "approval-responded",
                "approval": {"id": "7", "approved": True},
            },
            {
                "type": "tool-delete",
                "state": "approval-responded",
                "approval": {"id": "8", "approved": False, "reason": "no"},
            },
            {"type": "dynamic-tool", "state": "approval-requested", "approval": {"id": "9"}},
            {
                "type": "dynamic-tool",
                "state": "approval-responded",
                "approval": {"id": "../1", "approved": True},
            },
        ],
    }

    assert parse_chat_request(request(last)).decisions == [(7, True, ""), (8, False, "no")]


def test_requests_that_ask_for_nothing_are_refused_with_a_reason():
    user = {"role": "user", "parts": [{"type": "text", "text": "  "}]}
    assert parse_chat_request([]).problem
    assert parse_chat_request(request(user, id="../5")).problem == "id must be the chat's id."
    assert parse_chat_request(request(user, id=True)).problem == "id must be the chat's id."
    assert parse_chat_request(request(user)).problem == "The message has no text."
    assert parse_chat_request(request(user, trigger="regenerate-message")).problem
    assert parse_chat_request(request()).problem
    assert parse_chat_request(request({"role": "assistant", "parts": []})).problem
    assert parse_approval_id("12") == 12 and parse_approval_id("１２") is None


def test_the_parts_are_json_a_browser_reads():
    translator = UIStreamTranslator()
    parts = run(translator, message(2, "assistant", "<script>alert(1)</script>"))
    lines = b"".join(encode(part) for part in parts).decode().split("\n\n")
    assert json.loads(lines[2].removeprefix("data: "))["delta"] == "<script>alert(1)</script>"
