"""The example site's pages: my chats, a new chat with the demo agent, and the live chat page.

The chat page is rendered here; what happens next arrives through agentloop's event
stream (``agentloop:events``) and is drawn by ``static/example_project/chat.js``.
Cancel, approve, deny, answer, edit and regenerate are agentloop's own POST views.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from agentloop.exceptions import PendingToolCallsError
from agentloop.models import Chat, ChatState
from agentloop.web import can_change_chat, get_chat_for_view, resume_point

from .demo.agents import Assistant

#: characters of a first message that become the chat's title.
TITLE_LENGTH = 60
MAX_MESSAGE_LENGTH = 4000


@login_required
def chat_list(request: HttpRequest) -> HttpResponse:
    """My chats, newest first (subagents' chats are reached from their parent's page)."""
    chats = Chat.objects.owned_by(request.user).filter(parent__isnull=True)[:100]
    return render(request, "chats/list.html", {"chats": chats})


@require_POST
@login_required
def new_chat(request: HttpRequest) -> HttpResponse:
    """A chat with the demo agent; its first message, if given, is answered at once."""
    text = request.POST.get("text", "").strip()[:MAX_MESSAGE_LENGTH]
    chat = Assistant.create(owner=request.user)
    if text:
        chat.title = text[:TITLE_LENGTH]
        chat.save(update_fields=["title"])
        chat.ask_later(text)
        chat.complete_later()
    return redirect("chat_detail", pk=chat.pk)


@login_required
def chat_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The live chat page (the owner, or staff allowed to view chats; others get 404)."""
    chat = get_chat_for_view(request, pk)
    # Read before the messages: whatever is saved in between is sent again, not missed.
    position = resume_point(chat)
    rows = list(
        chat.messages.current()  # rows an edit or a regenerated answer replaced are not shown
        .exclude(status="partial")
        .exclude(role="system")
        .prefetch_related("tool_calls")
        .order_by("id")
    )
    children = dict(
        Chat.objects.filter(parent=chat).values_list("parent_tool_call_id", "pk")
    )  # the subagent chat of each call that started one
    context = {
        "chat": chat,
        "transcript": _transcript(rows, children),
        "position": position,
        "can_send": chat.owner_id == request.user.pk,
        # Edit and Regenerate post to agentloop's views, which let the owner and permitted
        # staff change a chat.
        "can_edit": can_change_chat(request.user, chat),
    }
    return render(request, "chats/detail.html", context)


def _transcript(rows: list[Any], children: dict[Any, Any]) -> list[dict[str, Any]]:
    """User and assistant messages, each tool call with its result (shown inside the call)."""
    results = {row.tool_call_id: row for row in rows if row.role == "tool"}
    shown = []
    for row in rows:
        if row.role == "tool":
            continue
        calls = [
            {
                "call": call,
                "arguments": json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":")),
                "result": results.get(call.pk),
                "child": children.get(call.pk),
            }
            for call in row.tool_calls.all()
        ]
        shown.append({"message": row, "calls": calls})
    return shown


@require_POST
@login_required
async def send_message(request: HttpRequest, pk: int) -> HttpResponse:
    """Add the owner's message and answer it in the background (204 for ``fetch``).

    An async view: under ASGI it holds no worker thread while it waits on the database."""
    user = await request.auser()
    chat = await Chat.objects.filter(pk=pk, owner=user).afirst()
    if chat is None:
        raise Http404("No such chat.")
    text = request.POST.get("text", "").strip()
    if not text:
        return _refused("Write a message first.", 400)
    if len(text) > MAX_MESSAGE_LENGTH:
        return _refused(f"A message has at most {MAX_MESSAGE_LENGTH} characters.", 400)
    try:
        # Typed while an answer streams: kept and answered after it, in order.
        await chat.aask_later(text, if_busy="queue")
    except PendingToolCallsError:
        return _refused("Decide on the waiting tool calls first.", 409)
    if chat.state not in (ChatState.QUEUED, ChatState.RUNNING):
        await sync_to_async(chat.complete_later)()
    if "text/html" in request.headers.get("Accept", ""):
        return redirect(reverse("chat_detail", args=[chat.pk]))
    return HttpResponse(status=204)


def _refused(reason: str, status: int) -> HttpResponse:
    return HttpResponse(reason, status=status, content_type="text/plain")
