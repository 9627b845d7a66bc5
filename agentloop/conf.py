"""agentloop's settings: one ``AGENTLOOP`` dict, read late and cached.

``from agentloop.conf import agentloop_settings`` then ``agentloop_settings.LEASE_SECONDS``.
Values come from ``settings.AGENTLOOP`` when Django is configured, else the defaults,
so the in-memory chat works in a plain script. The cache is dropped on Django's
``setting_changed`` signal (``override_settings`` in tests).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

__all__ = [
    "DEFAULTS",
    "AgentloopSettings",
    "Settings",
    "agentloop_settings",
    "get_chat_model",
    "settings_errors",
]


def _a_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")  # not a string, not a bool
    return value


#: seconds (or another non-negative number): 0.5, 60 (not infinity, not NaN).
_Seconds = Annotated[float, BeforeValidator(_a_number), Field(ge=0, allow_inf_nan=False)]
#: seconds to wait between two things: 0 would make a loop that never waits.
_Interval = Annotated[_Seconds, Field(gt=0)]
#: seconds of a Redis expiry, which counts whole seconds (0 or 0.5 would be "never").
_WholeSeconds = Annotated[_Seconds, Field(ge=1)]
#: the lease. At least a second: the heartbeat renews it every third of it and tries again
#: every sixth, giving up a sixth before it expires, so at 1 s each of its three tries has
#: some 170 ms, room for a database round trip or a reconnect on a busy host. Shorter, the
#: tries shrink to the heartbeat's 50 ms tick and 100 ms margin (at 0.2 s it gives up
#: before the first renewal is due); at 0 a lease has expired when it is taken, so two
#: workers run one chat.
_LeaseSeconds = Annotated[_Seconds, Field(ge=1)]
#: a count that may be 0 (retries).
_Count = Annotated[int, Field(strict=True, ge=0)]
#: a count of at least 1 (sizes, pool sizes).
_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
#: True or False (not "yes", not 1).
_Flag = Annotated[bool, Field(strict=True)]


def _concurrency_keys(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        provider, colon, model = key.partition(":")
        if not provider or (colon and not model) or (key == "default" and colon):
            raise ValueError(f"{key!r} is not 'default', a provider name or 'provider:model'")
    return value


#: model-call limits: {"default" | "<provider>" | "<provider>:<model>": a size, or None}.
_Concurrency = Annotated[dict[str, _PositiveInt | None], AfterValidator(_concurrency_keys)]


class Settings(BaseModel):
    """The ``AGENTLOOP`` dict, typed: each key, its type and its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: model used when a chat names none.
    DEFAULT_MODEL: str = "gpt-4.1-mini"
    #: per-provider settings: {"openai": {"api_key": ..., "base_url": ...}}.
    PROVIDERS: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: default tool concurrency: None (one after another), "threads", or a pool size.
    TOOL_CONCURRENCY: Literal["threads"] | _PositiveInt | None = None
    #: seconds between cancellation reads while an answer streams.
    CANCEL_POLL_INTERVAL: _Seconds = 0.2
    #: seconds one model call may take in all, from its start (waiting for a slot, streaming,
    #: keep-alive comments included); past it the call is aborted with ProviderTimeout (a
    #: transient error). ``PROVIDERS[name]["call_timeout"]`` sets one provider's. None: none.
    MODEL_CALL_TIMEOUT: _Seconds | None = 600.0
    #: model calls in flight at once per process: {"openai": 50, "anthropic:claude-opus-4": 10,
    #: "default": 100}; a model's limit, then its provider's (else "default"). {}: no limit.
    MODEL_CONCURRENCY: _Concurrency = Field(default_factory=dict)
    #: retries of one model call on a transient provider error.
    MODEL_RETRIES: _Count = 2
    #: first backoff in seconds (doubled each retry, with jitter); Retry-After wins.
    RETRY_BACKOFF: _Seconds = 0.5
    #: upper bound of one backoff sleep inside a step (a longer Retry-After is cut to it).
    RETRY_BACKOFF_MAX: _Seconds = 30.0
    #: the longest Retry-After honoured between background attempts of a step.
    RETRY_AFTER_MAX: _Seconds = 300.0
    #: seconds a lease on a chat lasts without renewal; the heartbeat renews every third,
    #: so a holder that died on another host is taken over within three heartbeats.
    LEASE_SECONDS: _LeaseSeconds = 30
    #: the chat model the views, tasks and admin use ("app_label.Model").
    CHAT_MODEL: str = "agentloop.Chat"
    #: Redis for live events and fast cancellation (e.g. "redis://127.0.0.1:6379/0"); None: DB.
    REDIS_URL: str | None = None
    #: events kept per chat in Redis (a reconnecting page can catch up on these).
    EVENTS_MAXLEN: _PositiveInt = 1000
    #: prefix of every Redis key agentloop writes; None: "agentloop:<default database NAME>",
    #: so two sites on one Redis database keep apart.
    REDIS_PREFIX: str | None = None
    #: live events a process holds for Redis while it is slow or away; when full, text
    #: chunks are merged, other chunks dropped, and messages push out the oldest event.
    EVENTS_QUEUE_SIZE: _PositiveInt = 10_000
    #: seconds a chat's Redis event stream lives after its latest event; None: no expiry
    #: (a deleted chat's stream is deleted with it either way).
    EVENTS_TTL: _WholeSeconds | None = 24 * 60 * 60
    #: seconds an open event stream goes without checking again that its reader may still
    #: see the chat (logged in, active, allowed); it closes when they may not.
    EVENTS_REAUTH_SECONDS: _Seconds = 30.0
    #: seconds between an event stream's reads of the chat (its state; its messages when
    #: there is no Redis).
    EVENTS_POLL_INTERVAL: _Interval = 0.5
    #: seconds of silence after which an event stream sends a keep-alive comment.
    EVENTS_KEEPALIVE: _Interval = 15.0
    #: largest event data (bytes of JSON) an event stream sends whole; a larger event is sent
    #: with its texts cut to fit and "truncated": true (the rows keep everything).
    EVENTS_MAX_BYTES: Annotated[int, Field(strict=True, ge=1024)] = 256 * 1024
    #: how background steps run: "celery", "embedded" (in-process threads), "django_tasks"
    #: (Django 6's tasks framework, settings.TASKS) or "auto" (Celery when its app has a
    #: broker configured, else embedded).
    RUNNER: str = "auto"
    #: the older name of RUNNER (read when RUNNER is "auto").
    BACKGROUND: str = "auto"
    #: threads of the embedded runner.
    EMBEDDED_WORKERS: _PositiveInt = 2
    #: attempts of a step after a transient provider error, in the background; the count is
    #: kept on the chat (re-enqueues by the sweeper don't reset it); then the chat fails.
    STEP_RETRIES: _Count = 5
    #: handoffs one turn may make (A to B to A...); past it a handoff is refused with an
    #: error result the model sees, and the current agent answers (docs/handoffs.md).
    MAX_HANDOFFS: _Count = 5
    #: a queued chat with no lease for this long is re-enqueued by the sweeper.
    STALE_QUEUED_SECONDS: _Seconds = 300
    #: what ask_later does while a run holds the chat: "reject" (ChatBusyError), "queue"
    #: (answered after the run), "interrupt" (the run is cancelled, then it is answered).
    IF_BUSY: Literal["reject", "queue", "interrupt"] = "reject"
    #: seconds a call may wait for approval before the sweeper denies it; None: no limit.
    APPROVAL_TIMEOUT: _Interval | None = None
    #: seconds between writes of a streaming partial answer to the database.
    PARTIAL_SAVE_INTERVAL: _Seconds = 1.0
    #: largest provider response read (bytes of one answer, plain or streamed); larger fails
    #: with ResponseTooLargeError and nothing of it is stored. None: no cap.
    MAX_RESPONSE_BYTES: _PositiveInt | None = 10 * 1024 * 1024
    #: largest attachment (bytes of one image or document) ask_later accepts; None: no cap.
    MAX_ATTACHMENT_BYTES: _PositiveInt | None = 20 * 1024 * 1024
    #: what `manage.py agentloop demo` runs: a dict (or its import path) with "instructions",
    #: "tools" (import paths), "questions" and optionally "title"; None: give them as options.
    DEMO: dict[str, Any] | str | None = None
    #: MCP tool servers by name: {"files": {"command": [...], "env": {...}}} (stdio) or
    #: {"search": {"url": "http://..."}} (streamable HTTP); see agentloop.mcp.
    MCP_SERVERS: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: OpenTelemetry spans after the GenAI semantic conventions (needs opentelemetry-api;
    #: see docs/tracing.md).
    TRACING: _Flag = False
    #: message text, tool arguments and results on the spans too (they may hold personal data).
    TRACE_CONTENT: _Flag = False
    #: PostgreSQL with psycopg 3: prepare the statements every step runs (claim, transcript
    #: read, write) from their second run on a connection, whatever the database's
    #: ``prepare_threshold``. A pooler that loses them (pgbouncer before 1.21 in transaction
    #: mode) turns it off in that process at its first error, with a warning; False: never.
    PREPARED_STATEMENTS: _Flag = True
    #: give the database connection back while a step waits (a model call, a tool run, a
    #: backoff) and take one again for its next statement: "auto" when Django's connection
    #: pool is configured (OPTIONS["pool"]: a check-in), True always (without a pool: a new
    #: connection after every wait), False never. Never inside a caller's atomic block.
    RELEASE_CONNECTIONS: Literal["auto"] | _Flag = "auto"
    #: days a chat may stay idle (no message, no run) before ``agentloop.delete_idle_chats``
    #: (run daily by beat, or ``manage.py agentloop retention``) deletes it; None: kept.
    RETENTION_DAYS: _PositiveInt | None = None


#: every key and its default value.
DEFAULTS: dict[str, Any] = Settings().model_dump()


def settings_errors(values: dict[str, Any]) -> dict[str, str]:
    """What is wrong with an ``AGENTLOOP`` dict, by key (the system checks report it)."""
    try:
        Settings.model_validate(values)
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for error in exc.errors(include_url=False):
            key = str(error["loc"][0]) if error["loc"] else ""
            errors.setdefault(key, error["msg"])
        return errors
    return {}


if TYPE_CHECKING:
    _Typed = Settings  # type checkers see every setting with its type
else:
    _Typed = object


class AgentloopSettings(_Typed):
    """Attribute access to the typed settings, cached until a setting changes.

    A key whose value is invalid reads as its default (system checks report it). A setting
    read once is kept as an attribute of this object until :meth:`reload`: the job path
    reads a few dozen per step, and a plain attribute costs nothing next to ``__getattr__``."""

    def __init__(self) -> None:
        self._cache: Settings | None = None
        self._lock = threading.Lock()

    def _load(self) -> Settings:
        try:
            # Function-local: settings are read late, never when this module is imported.
            from django.conf import settings
        except ImportError:  # pragma: no cover - Django is a dependency
            return Settings()
        user: Any = getattr(settings, "AGENTLOOP", None) if settings.configured else None
        if not isinstance(user, dict):  # anything else is reported by check agentloop.E001
            return Settings()
        errors = settings_errors(user)
        return Settings.model_validate(
            {key: value for key, value in user.items() if key in DEFAULTS and key not in errors}
        )

    @property
    def values(self) -> Settings:
        """The settings, typed."""
        if self._cache is None:
            self._cache = self._load()
        return self._cache

    def as_dict(self) -> dict[str, Any]:
        """The merged settings."""
        return self.values.model_dump()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown agentloop setting {name!r}")
        values = self.values
        value = getattr(values, name)
        with self._lock:
            if self._cache is values:  # not reloaded meanwhile: later reads skip this method
                self.__dict__[name] = value
        return value

    def reload(self) -> None:
        """Forget cached values; the next read sees the current settings."""
        with self._lock:
            self._cache = None
            for name in DEFAULTS:
                self.__dict__.pop(name, None)


#: the settings (typed like ``Settings``: ``agentloop_settings.LEASE_SECONDS`` is a float).
agentloop_settings = AgentloopSettings()


def get_chat_model() -> Any:
    """The chat model named by ``AGENTLOOP["CHAT_MODEL"]`` (default ``agentloop.Chat``): the one
    the views, the admin's actions and the commands serve. ``ImproperlyConfigured`` when it
    names no installed chat model (like ``django.contrib.auth.get_user_model``)."""
    # Function-local: conf is imported by settings-time code, before the app registry.
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    label = agentloop_settings.CHAT_MODEL
    try:
        model = apps.get_model(label, require_ready=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"AGENTLOOP['CHAT_MODEL'] must be of the form 'app_label.ModelName', not {label!r}."
        ) from None
    except LookupError:
        raise ImproperlyConfigured(
            f"AGENTLOOP['CHAT_MODEL'] refers to {label!r}, which is not installed."
        ) from None
    return model
