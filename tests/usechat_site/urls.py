"""The example site's URLs, and ``/usechat/<pk>/``: the React page for one chat, rendered
with the template agentloop ships (``agentloop/chat_react.html``) as docs/frontends.md does."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, URLResolver, path, reverse
from django.views.decorators.csrf import ensure_csrf_cookie

from agentloop import providers
from agentloop.web import get_chat_for_view
from example_project.urls import urlpatterns as example_urls

from .provider import provider

providers.register("usechat", provider)


@ensure_csrf_cookie  # the page sends the cookie's token back in X-CSRFToken
@login_required
def page(request: HttpRequest, pk: int) -> HttpResponse:
    """The view of docs/frontends.md: agentloop's shell template for the React app."""
    chat = get_chat_for_view(request, pk)
    context = {
        "chat": chat,
        "api": reverse("agentloop:usechat"),
        "cancel_url": reverse("agentloop:cancel", args=[chat.pk]),
    }
    return render(request, "agentloop/chat_react.html", context)


urlpatterns: list[URLPattern | URLResolver] = [
    path("usechat/<int:pk>/", page, name="usechat_page"),
    *example_urls,
]
