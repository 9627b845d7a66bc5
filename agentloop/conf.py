"""agentloop's settings: one ``AGENTLOOP`` dict, read late and cached.

``from agentloop.conf import agentloop_settings`` then ``agentloop_settings.LEASE_SECONDS``.
Values come from ``settings.AGENTLOOP`` when Django is configured, else the defaults,
so the in-memory chat works in a plain script. The cache is dropped on Django's
``setting_changed`` signal (``override_settings`` in tests).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULTS", "AgentloopSettings", "agentloop_settings", "get_chat_model"]

DEFAULTS: dict[str, Any] = {
    #: model used when a chat names none.
    "DEFAULT_MODEL": "gpt-4.1-mini",
    #: per-provider settings: {"openai": {"api_key": ..., "base_url": ...}}.
    "PROVIDERS": {},
    #: default tool concurrency: None (one after another), "threads", or a pool size.
    "TOOL_CONCURRENCY": None,
    #: seconds between cancellation reads while an answer streams.
    "CANCEL_POLL_INTERVAL": 0.2,
    #: retries of one model call on a transient provider error.
    "MODEL_RETRIES": 2,
    #: first backoff in seconds (doubled each retry, with jitter); Retry-After wins.
    "RETRY_BACKOFF": 0.5,
    #: upper bound of one backoff sleep inside a step; a longer Retry-After ends the step and
    #: (in the background) schedules the next attempt instead of holding the worker.
    "RETRY_BACKOFF_MAX": 30.0,
    #: the longest Retry-After honoured; a provider asking for more waits this long.
    "RETRY_AFTER_MAX": 300.0,
    #: seconds a worker's lease on a chat lasts without renewal.
    "LEASE_SECONDS": 60,
    #: the chat model the views, tasks and admin use ("app_label.Model").
    "CHAT_MODEL": "agentloop.Chat",
    #: Redis for live events and fast cancellation (e.g. "redis://127.0.0.1:6379/0"); None: DB.
    "REDIS_URL": None,
    #: events kept per chat in Redis (a reconnecting page can catch up on these).
    "EVENTS_MAXLEN": 1000,
    #: seconds between an event stream's reads of the chat (its state; its messages when
    #: there is no Redis).
    "EVENTS_POLL_INTERVAL": 0.5,
    #: seconds of silence after which an event stream sends a keep-alive comment.
    "EVENTS_KEEPALIVE": 15.0,
    #: how background steps run: "celery", "embedded" (in-process threads) or "auto"
    #: (Celery when its app has a broker configured, else embedded).
    "BACKGROUND": "auto",
    #: threads of the embedded runner.
    "EMBEDDED_WORKERS": 2,
    #: attempts of a step after a transient provider error, in the background; the count is
    #: kept on the chat (re-enqueues by the sweeper don't reset it); then the chat fails.
    "STEP_RETRIES": 5,
    #: a queued chat with no lease for this long is re-enqueued by the sweeper.
    "STALE_QUEUED_SECONDS": 300,
    #: seconds a call may wait for approval before the sweeper denies it; None: no limit.
    "APPROVAL_TIMEOUT": None,
    #: seconds between writes of a streaming partial answer to the database.
    "PARTIAL_SAVE_INTERVAL": 1.0,
    #: largest attachment (bytes of one image or document) ask_later accepts; None: no cap.
    "MAX_ATTACHMENT_BYTES": 20 * 1024 * 1024,
    #: what `manage.py agentloop demo` runs: a dict (or its import path) with "instructions",
    #: "tools" (import paths), "questions" and optionally "title"; None: give them as options.
    "DEMO": None,
}


class AgentloopSettings:
    """Attribute access to the merged settings, cached until a setting changes."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        merged = dict(DEFAULTS)
        try:
            # Function-local: settings are read late, never when this module is imported.
            from django.conf import settings
        except ImportError:  # pragma: no cover - Django is a dependency
            return merged
        if settings.configured:
            user = getattr(settings, "AGENTLOOP", None) or {}
            if isinstance(user, dict):  # anything else is reported by check agentloop.E001
                merged.update(user)
        return merged

    def as_dict(self) -> dict[str, Any]:
        """The merged settings."""
        if self._cache is None:
            self._cache = self._load()
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self.as_dict()
        if name not in values:
            raise AttributeError(f"Unknown agentloop setting {name!r}")
        return values[name]

    def reload(self) -> None:
        """Forget cached values; the next read sees the current settings."""
        self._cache = None


agentloop_settings = AgentloopSettings()


def get_chat_model() -> Any:
    """The chat model named by ``AGENTLOOP["CHAT_MODEL"]`` (default ``agentloop.Chat``)."""
    # Function-local: conf is imported by settings-time code, before the app registry.
    from django.apps import apps

    return apps.get_model(agentloop_settings.CHAT_MODEL)
