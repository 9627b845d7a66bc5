"""Who may see or change a chat: the rules every view, the event stream and the admin share.

The owner may see and change their chat; staff may with the model's permissions (``view_``
or ``change_``). Anyone else is told the chat doesn't exist (404, not 403).
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest

from ..conf import get_chat_model

__all__ = ["can_change_chat", "can_view_chat", "get_chat_for_change", "get_chat_for_view"]


def can_change_chat(user: Any, chat: Any) -> bool:
    """The owner, or staff holding the model's change permission."""
    if chat.owner_id is not None and chat.owner_id == user.pk:
        return True
    opts = chat._meta
    return bool(user.is_staff and user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


def get_chat_for_change(request: HttpRequest, pk: Any) -> Any:
    """The chat if this user may change it, else 404."""
    chat_model = get_chat_model()
    chat = chat_model.objects.filter(pk=pk).first()
    if chat is None or not can_change_chat(request.user, chat):
        raise Http404("No such chat.")
    return chat


def can_view_chat(user: Any, chat: Any) -> bool:
    """The owner, or staff holding the model's view (or change) permission."""
    if can_change_chat(user, chat):
        return True
    opts = chat._meta
    return bool(user.is_staff and user.has_perm(f"{opts.app_label}.view_{opts.model_name}"))


def get_chat_for_view(request: HttpRequest, pk: Any) -> Any:
    """The chat if this user may see it, else 404."""
    chat = get_chat_model().objects.filter(pk=pk).first()
    if chat is None or not can_view_chat(request.user, chat):
        raise Http404("No such chat.")
    return chat
