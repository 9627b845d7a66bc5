"""Views of a chat: POST views that change it (CSRF-protected), and its event stream.

Only the owner or permitted staff get through; anyone else gets 404 (not 403: a
chat's existence is not disclosed). POST answers are 204 for ``fetch``/XHR callers
and a redirect back for plain HTML forms.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from .conf import get_chat_model
from .exceptions import InvalidArgumentsError, ToolCallNotWaitingError
from .permissions import can_change_chat, can_view_chat, get_chat_for_change, get_chat_for_view
from .sse import stream_response

__all__ = [
    "answer_tool_call",
    "approve_tool_call",
    "can_change_chat",
    "can_view_chat",
    "cancel_chat",
    "chat_events",
    "deny_tool_call",
    "get_chat_for_change",
    "get_chat_for_view",
    "get_chat_model",
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


@require_POST
@login_required
def cancel_chat(request: HttpRequest, pk: int) -> HttpResponse:
    """Ask the chat's run to stop at its next checkpoint; 409 when no run is in progress,
    queued or waiting for a person (nothing is set, so the next message isn't stopped)."""
    if not get_chat_for_change(request, pk).cancel():
        return HttpResponse(
            "This chat has no run in progress: nothing to cancel.",
            status=409,
            content_type="text/plain",
        )
    return _done(request)


def _decide(request: HttpRequest, pk: int, call_pk: int, decide: Any) -> HttpResponse:
    chat = get_chat_for_change(request, pk)
    try:
        decide(chat, call_pk)
    except ToolCallNotWaitingError as exc:
        return HttpResponse(str(exc), status=409, content_type="text/plain")
    return _done(request)


@require_POST
@login_required
def approve_tool_call(request: HttpRequest, pk: int, call_pk: int) -> HttpResponse:
    """Approve a call that waits for approval: for exactly its arguments, or for the JSON
    object posted as ``arguments`` (edited; 400 when the tool's ``Params`` refuse it)."""
    posted = request.POST.get("arguments", "").strip()
    try:
        arguments = json.loads(posted) if posted else None
    except ValueError:
        return HttpResponse(
            "arguments must be a JSON object.", status=400, content_type="text/plain"
        )
    try:
        return _decide(
            request,
            pk,
            call_pk,
            lambda chat, call: chat.approve(call, by=request.user, arguments=arguments),
        )
    except InvalidArgumentsError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")


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
    """Answer a call's question with ``text``."""
    text = request.POST.get("text", "")
    if not text.strip():
        return HttpResponse("An answer needs some text.", status=400, content_type="text/plain")
    return _decide(
        request, pk, call_pk, lambda chat, call: chat.answer(call, text, by=request.user)
    )


@require_GET
@login_required
async def chat_events(request: HttpRequest, pk: int) -> HttpResponseBase:
    """The chat's live events as Server-Sent Events (``agentloop.sse``).

    Resumes after ``Last-Event-ID`` (or ``?after=``). Async under ASGI: an open
    stream holds no thread; under WSGI the stream is a sync iterator on its thread.
    """
    chat = await sync_to_async(get_chat_for_view)(request, pk)
    return stream_response(request, chat)
