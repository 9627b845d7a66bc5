"""Views of a chat: POST views that change it (CSRF-protected), and its event stream.

Only the owner or permitted staff get through; anyone else gets 404 (not 403: a
chat's existence is not disclosed). Edit and regenerate (docs/editing.md) supersede rows and
answer in the background. POST answers are 204 for ``fetch``/XHR callers
and a redirect back for plain HTML forms.

The ``usechat`` views speak the AI SDK's UI message stream protocol (``useChat``;
docs/frontends.md): a message or approvals in, the run streamed out; the resume stream;
the history as ``UIMessage`` objects. The ``ag_ui`` view speaks the AG-UI protocol (the same
page): a ``RunAgentInput`` in, the run out as AG-UI events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
)
from django.http.response import HttpResponseBase
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from ..conf import get_chat_model
from ..exceptions import (
    ChatBusyError,
    EditError,
    InvalidAnswerError,
    InvalidArgumentsError,
    PendingToolCallsError,
    ToolCallNotWaitingError,
)
from ..json_input import JSONInputError, parse_json, request_json
from ._access import (
    can_change_chat,
    can_view_chat,
    get_chat_for_change,
    get_chat_for_view,
    stream_slot,
)
from ._ag_ui import (
    AgUiFollower,
    AgUiTranslator,
    RunRequest,
    decide,
    messages_snapshot,
    parse_run_input,
)
from ._live import (
    IN_FLIGHT,
    RunFollower,
    resume_point,
    stream_response,
)
from ._ui_protocol import (
    ChatRequest,
    encode,
    error_line,
    parse_approval_id,
    parse_chat_request,
    row_payload,
    start_turn,
    turn_rows,
    ui_messages,
)

__all__ = [
    "ag_ui",
    "answer_tool_call",
    "decline_question",
    "approve_tool_call",
    "can_change_chat",
    "can_view_chat",
    "cancel_chat",
    "chat_events",
    "deny_tool_call",
    "edit_message",
    "get_chat_for_change",
    "get_chat_for_view",
    "get_chat_model",
    "regenerate_answer",
    "usechat",
    "usechat_messages",
    "usechat_stream",
]


def _done(request: HttpRequest) -> HttpResponse:
    """204 for scripts; for an HTML form, back to where it came from."""
    if "text/html" not in request.headers.get("Accept", ""):
        return HttpResponse(status=204)
    target = request.POST.get("next") or request.headers.get("Referer") or "/"
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = "/"
    return HttpResponseRedirect(target)


def _refused(reason: str, status: int) -> HttpResponse:
    return HttpResponse(reason, status=status, content_type="text/plain")


@require_POST
@login_required
def cancel_chat(request: HttpRequest, pk: int) -> HttpResponse:
    """Ask the chat's run to stop at its next checkpoint; 409 when no run is in progress,
    queued or waiting for a person (nothing is set, so the next message isn't stopped)."""
    if not get_chat_for_change(request, pk).cancel():
        return _refused("This chat has no run in progress: nothing to cancel.", 409)
    return _done(request)


def _decide(request: HttpRequest, pk: int, call_pk: int, decide: Any) -> HttpResponse:
    """``decide(chat, call_pk)`` on a chat this user may change: 409 when the call no longer
    waits, 400 with the one-line reason when what was posted is refused (arguments the
    tool's ``Params`` refuse, an answer its schema refuses: the call still waits)."""
    chat = get_chat_for_change(request, pk)
    try:
        decide(chat, call_pk)
    except ToolCallNotWaitingError as exc:
        return _refused(str(exc), 409)
    except (InvalidArgumentsError, InvalidAnswerError) as exc:
        return _refused(str(exc), 400)
    return _done(request)


@require_POST
@login_required
def approve_tool_call(request: HttpRequest, pk: int, call_pk: int) -> HttpResponse:
    """Approve a call that waits for approval: for exactly its arguments, or for the JSON
    object posted as ``arguments`` (edited; 400 when the tool's ``Params`` refuse it)."""
    posted = request.POST.get("arguments", "").strip()
    try:
        arguments = parse_json(posted, "arguments") if posted else None
    except JSONInputError as exc:
        return _refused(str(exc), 400)
    return _decide(
        request,
        pk,
        call_pk,
        lambda chat, call: chat.approve(call, by=request.user, arguments=arguments),
    )


@require_POST
@login_required
def deny_tool_call(request: HttpRequest, pk: int, call_pk: int) -> HttpResponse:
    """Deny a call; ``reason`` (optional) is passed on to the model."""
    reason = request.POST.get("reason", "")[:2000]
    return _decide(
        request, pk, call_pk, lambda chat, call: chat.deny(call, reason=reason, by=request.user)
    )


@require_POST
@login_required
def answer_tool_call(request: HttpRequest, pk: int, call_pk: int) -> HttpResponse:
    """Answer a call's question with ``text`` (an MCP server's question: a JSON object, 400
    with the one-line reason when its schema refuses it; the question still waits)."""
    text = request.POST.get("text", "")
    if not text.strip():
        return _refused("An answer needs some text.", 400)
    return _decide(
        request, pk, call_pk, lambda chat, call: chat.answer(call, text, by=request.user)
    )


@require_POST
@login_required
def decline_question(request: HttpRequest, pk: int, call_pk: int) -> HttpResponse:
    """Decline an MCP server's question (``action=cancel``: dismiss it); 409 when it no
    longer waits, 400 for another action."""
    action = request.POST.get("action", "decline")
    return _decide(
        request, pk, call_pk, lambda chat, call: chat.decline(call, by=request.user, action=action)
    )


# -- editing (docs/editing.md) ------------------------------------------------------------------
def _rerun(request: HttpRequest, chat: Any, replace: Any) -> HttpResponse:
    """``replace()`` supersedes what it replaces and adds the new user message; the chat then
    answers it in the background. 409 while a run holds the chat, or when there is nothing
    that can be replaced (the message says which)."""
    try:
        replace()
    except ChatBusyError:
        return _refused("The chat is answering: wait for it, or cancel its run, first.", 409)
    except EditError as exc:
        return _refused(str(exc), 409)
    chat.complete_later()
    return _done(request)


@require_POST
@login_required
def regenerate_answer(request: HttpRequest, pk: int) -> HttpResponse:
    """A new answer to the chat's last user message (the replaced rows are superseded: kept,
    never sent again), run in the background."""
    chat = get_chat_for_change(request, pk)
    return _rerun(request, chat, chat.regenerate_later)


@require_POST
@login_required
def edit_message(request: HttpRequest, pk: int, message_pk: int) -> HttpResponse:
    """Replace one of the chat's user messages with the posted ``text`` and answer it in the
    background; that message and every later one are superseded. 404 for a message of
    another chat, 400 without text."""
    chat = get_chat_for_change(request, pk)
    message = chat.messages.filter(pk=message_pk).first()
    if message is None:
        raise Http404("No such message.")
    text = request.POST.get("text", "").strip()
    if not text:
        return _refused("An edited message needs some text.", 400)
    return _rerun(request, chat, lambda: chat.edit_later(message, text))


@require_GET
@login_required
async def chat_events(request: HttpRequest, pk: int) -> HttpResponseBase:
    """The chat's live events as Server-Sent Events (``agentloop.web._live``).

    Resumes after ``Last-Event-ID`` (or ``?after=``). Async under ASGI: an open
    stream holds no thread; under WSGI the stream is a sync iterator on its thread.
    """
    return await sync_to_async(_chat_event_stream)(request, pk)


def _chat_event_stream(request: HttpRequest, pk: int) -> HttpResponseBase:
    with stream_slot(request, pk) as opened:
        if opened.chat is not None:
            opened.response = stream_response(request, opened.chat)
    return opened.response


# -- useChat (the AI SDK's UI message stream protocol) ---------------------------------------
# The useChat views are sync: their setup is a few queries, and under ASGI the response
# still streams through an async iterator (agentloop.web._live), holding no thread.
@require_POST
@login_required
def usechat(request: HttpRequest) -> HttpResponseBase:
    """``useChat``'s POST: the last message's text is added to the chat (or its approval
    responses decided, as the approve and deny views do) and the chat runs in the
    background; the answer is streamed as it is saved, to the end of the run."""
    return _streamed_post(request, parse_chat_request, _start_run)


def _streamed_post(
    request: HttpRequest, parse: Callable[[Any], Any], start_run: Callable[..., Any]
) -> HttpResponseBase:
    """A protocol's POST: the body read and parsed (400 for a refused one), then, holding one
    of the user's stream slots (429 when none is free), the run of the chat it names (404
    unless the user may change it) started and streamed (``start_run(request, chat, asked)``:
    the stream, or a refusal)."""
    try:
        body = request_json(request)
    except JSONInputError as exc:
        return _refused(str(exc), 400)
    asked = parse(body)
    if asked.problem:
        return _refused(asked.problem, 400)
    with stream_slot(request, asked.chat_pk, change=True) as opened:
        if opened.chat is not None:
            opened.response = start_run(request, opened.chat, asked)
    return opened.response


def _add_message(chat: Any, text: str, waiting: str) -> HttpResponse | None:
    """The user's message added (its run is sent once the stream knows where the turn
    starts); a refusal (409) when the chat is answering already, or when calls wait for a
    person (``waiting`` says so)."""
    try:
        chat.ask_later(text, if_busy="reject")
    except ChatBusyError:
        return _refused("The chat is answering already: wait, or cancel its run.", 409)
    except PendingToolCallsError:
        return _refused(waiting, 409)
    return None


def _start_run(request: HttpRequest, chat: Any, asked: ChatRequest) -> HttpResponseBase:
    # Read before anything is written: what is saved from now on is streamed.
    position = resume_point(chat)
    if asked.text:
        not_added = _add_message(chat, asked.text, "Approve or deny the waiting tool calls first.")
        if not_added is not None:
            return not_added
    # Read before the run is sent, and before any decision: with approvals the page shows
    # this turn already, and its calls get results now.
    turn = start_turn(chat, "added" if asked.text else "shown")
    if asked.text:
        if chat.state not in IN_FLIGHT:
            chat.complete_later()
    else:
        for call_pk, approved, reason in asked.decisions:
            try:
                if approved:
                    chat.approve(call_pk, by=request.user)
                else:
                    chat.deny(call_pk, reason=reason, by=request.user)
            except (ToolCallNotWaitingError, InvalidArgumentsError) as exc:
                return _refused(str(exc), 409)
        # Tool outputs from the page answer the calls waiting for an answer; the others
        # are the results the page was sent, and are left alone.
        asking = set(
            chat.tool_calls.filter(state="waiting", wait_reason="question").values_list(
                "call_id", flat=True
            )
        )
        answers = [(call_id, text) for call_id, text in asked.answers if call_id in asking]
        if not asked.decisions and not answers:
            return _refused("Nothing in the last message is waiting for a decision.", 409)
        for call_id, text in answers:
            try:
                chat.answer(call_id, text, by=request.user)
            except ToolCallNotWaitingError as exc:
                return _refused(str(exc), 409)
    return RunFollower.respond(request, chat, position, turn.translator, turn.floor, turn.head)


@require_GET
@login_required
def usechat_stream(request: HttpRequest, pk: int) -> HttpResponseBase:
    """``useChat``'s resume (``GET {api}/{id}/stream``): 204 when no run is in flight,
    else the turn so far (from the database) and then the rest of it, live."""
    with stream_slot(request, pk) as opened:
        if opened.chat is not None:
            opened.response = _resume_run(request, opened.chat)
    return opened.response


def _resume_run(request: HttpRequest, chat: Any) -> HttpResponseBase:
    if chat.state not in IN_FLIGHT:
        return HttpResponse(status=204)
    position = resume_point(chat)  # before the rows: a row saved in between comes twice
    turn = start_turn(chat, "replayed")
    return RunFollower.respond(request, chat, position, turn.translator, turn.floor, turn.head)


@require_GET
@login_required
def usechat_messages(request: HttpRequest, pk: int) -> JsonResponse:
    """The chat as ``UIMessage`` objects (``useChat``'s initial ``messages``), its state,
    and whether a run is in flight (then resume its stream). ``?superseded=1`` includes the
    messages an edit or a regenerated answer replaced (``metadata.superseded``)."""
    chat = get_chat_for_view(request, pk)
    include_superseded = request.GET.get("superseded") in ("1", "true")
    return JsonResponse(
        {
            "id": str(chat.pk),
            "state": chat.state,
            "running": chat.state in IN_FLIGHT,
            "error": error_line(chat.error) if chat.state == "failed" else "",
            "messages": ui_messages(chat, include_superseded=include_superseded),
        }
    )


# -- AG-UI (docs/frontends.md) -------------------------------------------------------------------
@require_POST
@login_required
def ag_ui(request: HttpRequest) -> HttpResponseBase:
    """An AG-UI ``RunAgentInput`` (``threadId``: the chat's pk): a new user message is added
    and the chat runs in the background; interrupts' answers (``resume``) approve, deny or
    answer the waiting calls; with neither, the persisted chat is replayed. The run streams
    as AG-UI events to its end (``agentloop.web._ag_ui``)."""
    return _streamed_post(request, parse_run_input, _start_ag_ui_run)


def _start_ag_ui_run(request: HttpRequest, chat: Any, asked: RunRequest) -> HttpResponseBase:
    # Read before anything is written: what is saved from now on is streamed.
    position = resume_point(chat)
    translator = AgUiTranslator(str(chat.pk), asked.run_id)
    answers = asked.answers or asked.tool_answers
    replay = None
    user_pk, rows = turn_rows(chat)
    if asked.text and not _sent_by_us(chat, asked.message_id):
        not_added = _add_message(
            chat, asked.text, "Answer the interrupts (the waiting tool calls) first."
        )
        if not_added is not None:
            return not_added
        user_pk, rows = turn_rows(chat)
        if chat.state not in IN_FLIGHT:
            chat.complete_later()
    elif answers:
        for row in rows:  # the client shows this turn already: its calls get results now
            translator.know(row_payload(row))
        refused = decide(chat, request.user, answers)
        if refused is not None and (asked.answers or refused[0] != 409):
            return _refused(refused[1], refused[0])
        if refused is not None:  # tool messages that answer nothing: results it was sent
            replay = messages_snapshot(chat)
    else:
        replay = messages_snapshot(chat)
    floor = max([user_pk, *(row.pk for row in rows)])
    if replay is not None:  # the client holds the chat as the database has it
        for payload in replay[1]:
            translator.know(payload)
        floor = max([floor, *(payload["id"] for payload in replay[1])])
    chat.refresh_from_db(fields=["state"])
    head = [encode(e) for e in translator.start(chat.state, replay[0] if replay else None)]
    return AgUiFollower.respond(request, chat, position, translator, floor, head)


def _sent_by_us(chat: Any, message_id: str) -> bool:
    """The client's last user message is one the server sent it (``u<pk>``): not new."""
    pk = parse_approval_id(message_id[1:]) if message_id.startswith("u") else None
    return pk is not None and chat.messages.filter(pk=pk, role="user").exists()
