"""The example site's URLs, and ``/usechat/<pk>/``: the React page for one chat."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import URLPattern, URLResolver, path, reverse
from django.utils.html import format_html
from django.views.decorators.csrf import ensure_csrf_cookie

from agentloop import providers
from agentloop.web import get_chat_for_view
from example_project.urls import urlpatterns as example_urls

from .provider import provider

providers.register("usechat", provider)


@ensure_csrf_cookie  # the page sends the cookie's token back in X-CSRFToken
@login_required
def page(request: HttpRequest, pk: int) -> HttpResponse:
    """The shell the React app mounts in: the chat's id and agentloop's URLs in data-*."""
    chat = get_chat_for_view(request, pk)
    return HttpResponse(
        format_html(
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            "<title>useChat and agentloop</title>"
            '<link rel="stylesheet" href="{}"></head><body>'
            '<div id="root" data-chat-id="{}" data-api="{}" data-cancel-url="{}"></div>'
            '<script type="module" src="{}"></script></body></html>',
            static("usechat/usechat.css"),
            chat.pk,
            reverse("agentloop:usechat"),
            reverse("agentloop:cancel", args=[chat.pk]),
            static("usechat/usechat.js"),
        )
    )


urlpatterns: list[URLPattern | URLResolver] = [
    path("usechat/<int:pk>/", page, name="usechat_page"),
    *example_urls,
]
