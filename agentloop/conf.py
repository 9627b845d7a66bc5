"""agentloop's settings: one ``AGENTLOOP`` dict, read late and cached.

``from agentloop.conf import agentloop_settings`` then ``agentloop_settings.LEASE_SECONDS``.
Values come from ``settings.AGENTLOOP`` when Django is configured, else the defaults,
so the in-memory chat works in a plain script. The cache is dropped on Django's
``setting_changed`` signal (``override_settings`` in tests).
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

__all__ = [
    "DEFAULTS",
    "AgentloopSettings",
    "BudgetLimits",
    "MCPServe",
    "ModelPrice",
    "RateLimit",
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


def _an_amount(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValueError("must be an amount of US dollars (a Decimal, a string or a number)")
    try:
        # A float goes through its shortest repr: 0.1 is 0.1, not 0.1000000000000000055...
        amount = Decimal(str(value).strip())
    except ArithmeticError:
        raise ValueError(f"must be an amount of US dollars, not {value!r}") from None
    if not amount.is_finite():
        raise ValueError("must be a finite amount")
    return amount


#: an amount of US dollars: Decimal("20.00"), "20.00" or 20 (priced to 1e-8, as usage rows).
_Dollars = Annotated[
    Decimal, BeforeValidator(_an_amount), Field(ge=0, max_digits=14, decimal_places=8)
]


class BudgetLimits(BaseModel):
    """``AGENTLOOP["BUDGETS"]``: what each budget subject (an owner, by default) may use;
    a key left out (or None) sets no limit. Days and months are those of ``TIME_ZONE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: US dollars of known cost per day.
    cost_per_day: _Dollars | None = None
    #: US dollars of known cost per calendar month.
    cost_per_month: _Dollars | None = None
    #: tokens (input + output) per day.
    tokens_per_day: _Count | None = None
    #: tokens (input + output) per calendar month.
    tokens_per_month: _Count | None = None
    #: chats of the subject running at once (queued, running, or in a verb in process).
    chats_in_flight: _PositiveInt | None = None


class MCPServe(BaseModel):
    """``AGENTLOOP["MCP_SERVE"]``: the agents served over MCP (docs/mcp.md, serving agents)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: import paths of the agents offered, each as a tool named after the class in snake case.
    agents: list[str] = Field(default_factory=list)
    #: how a call's chat runs: "background" (complete_later: the runner, Celery in
    #: production) or "in_process" (a thread of the serving process).
    run: Literal["background", "in_process"] = "background"
    #: seconds between two reads of a running chat (its state and new messages).
    poll_interval: _Interval = 0.5
    #: seconds between two progress notifications while the chat waits for a person.
    keepalive: _Interval = 15.0
    #: the server's name in the MCP handshake.
    name: str = "agentloop"


class RateLimit(BaseModel):
    """One ``AGENTLOOP["RATE_LIMITS"]`` entry: the fleet's pace for a provider or a model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: model calls per minute, across every process.
    requests_per_minute: _PositiveInt | None = None
    #: tokens per minute (each call counts its estimate: input + max output tokens).
    tokens_per_minute: _PositiveInt | None = None


def _rate_limit_keys(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        provider, colon, model = key.partition(":")
        if not provider or (colon and not model) or key == "default":
            raise ValueError(f"{key!r} is not a provider name or 'provider:model'")
    return value


#: {"<provider>" | "<provider>:<model>": RateLimit}.
_RateLimits = Annotated[dict[str, RateLimit], AfterValidator(_rate_limit_keys)]


class ModelPrice(BaseModel):
    """One ``AGENTLOOP["PRICES"]`` entry: a model's prices in US dollars per million tokens,
    written as ``models.json`` writes them. Only input and output are required: cache reads
    cost ``cached_input_price`` (else input's), cache writes ``cache_write_price`` (else
    input's), those kept an hour ``cache_write_1h_price`` (else the 5-minute price)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_price: _Dollars
    output_price: _Dollars
    cached_input_price: _Dollars | None = None
    cache_write_price: _Dollars | None = None
    cache_write_1h_price: _Dollars | None = None


def _price_keys(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        provider, colon, model = key.partition(":")
        if not (provider and colon and model):
            raise ValueError(f"{key!r} is not 'provider:model'")
    return value


#: {"<provider>:<model>": ModelPrice}.
_Prices = Annotated[dict[str, ModelPrice], AfterValidator(_price_keys)]


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
    #: seconds one guardrail may take to decide (a guardrail's own ``timeout=`` wins); past
    #: it the guardrail fails closed (GuardrailError). None: no limit.
    GUARDRAIL_TIMEOUT: _Interval | None = 30.0
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
    #: live streams (event streams and useChat streams) one user may have open at once, across
    #: the processes sharing REDIS_URL (per process without Redis); past it a 429. None: no cap.
    EVENTS_STREAMS_PER_USER: _PositiveInt | None = 10
    #: largest JSON a view reads from a person (a useChat body, edited tool arguments), bytes.
    JSON_MAX_BYTES: _PositiveInt = 2_621_440
    #: deepest nesting (arrays and objects inside each other) of that JSON.
    JSON_MAX_DEPTH: _PositiveInt = 100
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
    #: {"search": {"url": "http://..."}} (streamable HTTP); see agentloop.tools.mcp.
    MCP_SERVERS: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: agents served over MCP (agentloop.web.mcp_asgi, ``manage.py agentloop mcp-serve``):
    #: {"agents": ["myapp.agents.Research"], "run": "background", ...}.
    MCP_SERVE: MCPServe = Field(default_factory=MCPServe)
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
    #: "provider:model" that embeds memories (the memory tools, the recall before a model
    #: call, ``manage.py agentloop memory reindex``) unless ``with_memory(model=...)`` names
    #: another; a search compares only the memories this model embedded (after a change:
    #: reindex).
    MEMORY_EMBEDDING_MODEL: str = "openai:text-embedding-3-small"
    #: on PostgreSQL, the candidates an HNSW search of memories keeps (pgvector's
    #: ``hnsw.ef_search``, for that statement only): more finds more of the true nearest,
    #: a little slower (bench/README.md: recall@10 0.99 at 200 on 1,000,000 vectors).
    MEMORY_EF_SEARCH: Annotated[int, Field(strict=True, ge=1, le=1000)] = 200
    #: "provider:model" that embeds past chats' messages in the background (the periodic task
    #: agentloop.embed_past_messages), so a chat can search its owner's other chats
    #: (agentloop.past_chats, the search_past_chats tool); None: off, nothing embedded.
    PAST_CHATS_EMBEDDING_MODEL: str | None = None
    #: the vectors' length, for a model that can make shorter ones; None: the model's own.
    PAST_CHATS_DIMENSIONS: _PositiveInt | None = None
    #: budgets and quotas per subject (docs/budgets.md): {"cost_per_day": "20.00",
    #: "cost_per_month": ..., "tokens_per_day": ..., "tokens_per_month": ...,
    #: "chats_in_flight": 3}; each subject's ``Budget`` row may set its own. None: no budgets
    #: (nothing counted); {} counts spend with no default limit.
    BUDGETS: BudgetLimits | None = None
    #: import path of ``subject(chat)``: whom a chat's spend counts against (a model instance,
    #: a string, an ``agentloop.budgets.Subject``, a list of them, or None); None: its owner.
    BUDGET_SUBJECT: str | None = None
    #: seconds a budget reservation of a model call lasts: a process that died mid-call
    #: leaves one, which stops counting after this.
    BUDGET_RESERVATION_SECONDS: _Interval = 900.0
    #: output tokens a call is counted for before it answers when the chat sets no
    #: ``max_output_tokens`` (budget reservations, tokens-per-minute limits).
    ESTIMATED_OUTPUT_TOKENS: _PositiveInt = 4096
    #: model calls and tokens per minute across the fleet, per provider or model:
    #: {"openai": {"requests_per_minute": 500, "tokens_per_minute": 200_000}}. Redis buckets
    #: when REDIS_URL is set, else rows in the database.
    RATE_LIMITS: _RateLimits = Field(default_factory=dict)
    #: seconds a background step waits in place for a rate limit; a longer wait ends the step
    #: and its job is sent again when the limit has room (no worker slot is held).
    RATE_LIMIT_WAIT: _Seconds = 5.0
    #: prices of models per million tokens, by "provider:model" (the provider's name as
    #: configured, or its kind: "vertexai", "azure", "bedrock"): {"azure:gpt-5-nano":
    #: {"input_price": "0.05", "output_price": "0.40"}}. They win over the model catalog
    #: and genai-prices (docs/budgets.md).
    PRICES: _Prices = Field(default_factory=dict)


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
