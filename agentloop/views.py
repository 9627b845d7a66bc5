"""Views that change a chat: POST only, CSRF-protected, owner or permitted staff.

Anyone else gets 404 (not 403: a chat's existence is not disclosed). Answers are
204 for ``fetch``/XHR callers and a redirect back for plain HTML forms.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from .conf import agentloop_settings

__all__ = ["cancel_chat", "get_chat_model", "get_chat_for_change"]


def get_chat_model() -> Any:
    """The chat model named by ``AGENTLOOP["CHAT_MODEL"]`` (default ``agentloop.Chat``)."""
    return apps.get_model(agentloop_settings.CHAT_MODEL)


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
    """Ask the chat's run to stop at its next checkpoint."""
    get_chat_for_change(request, pk).cancel()
    return _done(request)
