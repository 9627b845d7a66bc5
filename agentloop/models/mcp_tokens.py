"""``MCPToken``: a user's key to the agents served over MCP (docs/mcp.md, serving agents).

A token is shown once, when it is made; only its SHA-256 digest is stored, with its first
characters to tell tokens apart in lists. A token is as good as its user: the chats an MCP
call makes are that user's. Deleting the row revokes it.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

__all__ = ["MCPToken", "MCPTokenQuerySet"]

#: what every token starts with, so one found in a log or a file is recognised.
TOKEN_PREFIX = "agentloop_"  # noqa: S105 - what every token starts with, not a secret
#: characters of a token kept in clear (the prefix and a few more), to tell tokens apart.
SHOWN = len(TOKEN_PREFIX) + 6
#: "last used" is written at most this often (seconds): a busy client costs no write a call.
TOUCH_EVERY = 60.0


def digest(raw: str) -> str:
    """The stored form of a token: its SHA-256, hex. Tokens are random (256 bits), so a
    plain hash is enough: there is nothing to guess a password from."""
    return hashlib.sha256(raw.encode()).hexdigest()


class MCPTokenQuerySet(models.QuerySet["MCPToken"]):
    def issue(self, user: Any, name: str = "") -> tuple[MCPToken, str]:
        """A new token for ``user``: the row, and the token itself (shown this once)."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = self.create(user=user, name=name, digest=digest(raw), shown=raw[:SHOWN])
        return token, raw

    def authenticate(self, raw: str) -> Any:
        """The active user a token belongs to, or None (unknown, revoked, inactive user)."""
        if not raw.startswith(TOKEN_PREFIX):
            return None
        token = self.select_related("user").filter(digest=digest(raw)).first()
        if token is None or not getattr(token.user, "is_active", True):
            return None
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > TOUCH_EVERY:
            self.model._default_manager.filter(pk=token.pk).update(last_used_at=now)
        return token.user


class MCPToken(models.Model):
    """One user's token for the MCP endpoint (and ``manage.py agentloop mcp-serve``)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="agentloop_mcp_tokens",
        verbose_name=_("user"),
    )
    name = models.CharField(_("name"), max_length=100, blank=True, help_text=_("What it is for."))
    digest = models.CharField(_("SHA-256 of the token"), max_length=64, unique=True, editable=False)
    shown = models.CharField(_("starts with"), max_length=32, editable=False)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True, editable=False)

    objects = MCPTokenQuerySet.as_manager()

    class Meta:
        verbose_name = _("MCP token")
        verbose_name_plural = _("MCP tokens")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.shown}… ({self.name})" if self.name else f"{self.shown}…"
