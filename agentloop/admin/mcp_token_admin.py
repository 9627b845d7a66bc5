"""``MCPTokenAdmin``: the tokens that let users call the agents served over MCP.

Adding one asks only for its user and what it is for; the token is made on save and shown
once, in the page's message (only its digest is stored). Deleting a row revokes it. A
token's name is all that can change afterwards.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import gettext as _

from ..models import MCPToken

__all__ = ["MCPTokenAdmin"]


@admin.register(MCPToken)
class MCPTokenAdmin(admin.ModelAdmin):
    """MCP tokens: made here (shown once), listed by their first characters, deleted."""

    list_display = ("__str__", "user", "name", "created_at", "last_used_at")
    list_filter = ("created_at",)
    search_fields = ("name", "shown", "user__username")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    readonly_fields = ("shown", "created_at", "last_used_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("user", "name")
        return ("user", "name", "shown", "created_at", "last_used_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return ("user", "shown", "created_at", "last_used_at")

    def save_model(
        self, request: HttpRequest, obj: Any, form: forms.ModelForm, change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, raw = MCPToken.objects.issue(obj.user, name=obj.name)
        obj.pk, obj.digest, obj.shown, obj.created_at = (
            token.pk,
            token.digest,
            token.shown,
            token.created_at,
        )
        obj._state.adding = False
        messages.warning(
            request,
            _("The new token (shown this once; copy it now): %(token)s") % {"token": raw},
        )
