"""The ``with_*`` methods: each changes a chat's config (:mod:`.config`) through the store
and returns the chat, so calls chain."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ValidationError

from .. import providers
from ..exceptions import ConfigurationError
from ..guardrails import Guardrail, as_guardrail
from ..importing import import_path_of, load_by_path
from ..mcp import mcp_tools
from ..messages import Caching, Message, Thinking
from ..tools import Tool
from .chat_config import Compaction, Limits, ToolOptions

if TYPE_CHECKING:
    from .store import ChatStore

__all__ = ["UNSET", "Configuration"]

#: an argument not given (None is a value some arguments take); the chat model passes it on.
UNSET: Any = object()


def _as_tool_class(obj: Any) -> type[Tool]:
    """A Tool class from what users pass to ``with_tools``."""
    if isinstance(obj, type) and issubclass(obj, Tool):
        return obj
    as_tool = getattr(obj, "as_tool", None)
    if callable(as_tool):  # agents, and anything else that can become a tool
        converted = as_tool()
        if isinstance(converted, type) and issubclass(converted, Tool):
            return converted
    raise ConfigurationError(
        f"{obj!r} is not a tool: pass a Tool subclass or a function decorated with @tool."
    )


def _package_name(obj: Any) -> str:
    """``billing`` for a class in ``billing.agents`` or ``billing``."""
    parts = [part for part in obj.__module__.split(".") if part not in {"agents", "tools"}]
    return parts[-1] if parts else obj.__module__.split(".")[-1]


def _agent_of(tool_class: Any) -> Any:
    """The agent behind an agent tool or a handoff tool; None for any other tool."""
    return getattr(tool_class, "agent_class", None) or getattr(tool_class, "handoff_agent", None)


def _base_name(tool_class: Any, agent: Any) -> str:
    """An agent's tool's name before any package prefix a clash gave it."""
    prefixed = tool_class.default_name(_package_name(agent))
    return str(tool_class.default_name() if tool_class.name == prefixed else tool_class.name)


def _agent_names(tool_classes: list[Any]) -> list[Any]:
    """Agent tools (and handoffs) named alike by agents of different modules
    (billing.Research, legal.Research) all take their package's name as a prefix
    ("billing_research", "legal_research"; "transfer_to_billing_research"), whatever the
    order they came in; a lone one keeps its own name."""
    agents_by_name: dict[str, set[Any]] = defaultdict(set)
    for tool_class in tool_classes:
        agent = _agent_of(tool_class)
        if agent is not None:
            agents_by_name[_base_name(tool_class, agent)].add(agent)
    named = []
    for tool_class in tool_classes:
        agent = _agent_of(tool_class)
        if agent is not None:
            base, package = _base_name(tool_class, agent), _package_name(agent)
            name = base
            if len(agents_by_name[base]) > 1:
                # The default name takes the prefix where it belongs; a given one in front.
                given = base != tool_class.default_name()
                name = f"{package}_{base}" if given else tool_class.default_name(package)
            if name != tool_class.name:
                tool_class = tool_class.renamed(name)
        named.append(tool_class)
    return named


def _as_handoff_tool(obj: Any) -> type[Tool]:
    """A handoff tool from what users pass to ``with_handoffs``: an agent (or its import
    path), or the tool ``Agent.as_handoff(...)`` made."""
    if isinstance(obj, str):
        obj = load_by_path(obj)
    if isinstance(obj, type) and issubclass(obj, Tool) and hasattr(obj, "handoff_agent"):
        return obj
    as_handoff = getattr(obj, "as_handoff", None)
    if callable(as_handoff):
        converted = as_handoff()
        if isinstance(converted, type) and issubclass(converted, Tool):
            return converted
    raise ConfigurationError(
        f"{obj!r} is not an agent: with_handoffs() takes Agent subclasses, their import "
        "paths, or the tools Agent.as_handoff() makes."
    )


class Configuration:
    """Chainable configuration; each method persists through the store and returns the chat.

    The base of ``Conversation``: it owns the chat's store and the pydantic model of a
    ``with_schema`` chat in this process."""

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self._schema_model: type[BaseModel] | None = None

    def _given_schema_model(self) -> type[BaseModel] | None:
        """The pydantic model given to ``with_schema`` in this process, if any."""
        return self._schema_model

    def with_model(self, model: str, provider: str | None = None) -> Self:
        """Use ``model`` (``"provider:model"`` or a known model id) from now on."""
        providers.split_model(model, provider)  # fail now on a model nobody can serve
        self.store.config.update_config(model=model, provider=provider)
        return self

    def with_instructions(self, text: str, append: bool = False) -> Self:
        """Set the system message (replacing earlier ones unless ``append``)."""
        if append:
            self.store.transcript.append_message(Message(role="system", content=text))
        else:
            self.store.transcript.replace_instructions(text)
        return self

    def with_tools(self, *tools: Any, replace: bool = False) -> Self:
        """Offer these tools (Tool classes, @tool functions, agents) to the model."""
        current = [] if replace else list(self.store.config.get_tools())
        by_name: dict[str, type[Tool]] = {}
        # A later tool of the same name replaces an earlier one.
        for tool_class in _agent_names([*current, *(_as_tool_class(tool) for tool in tools)]):
            by_name[tool_class.name] = tool_class
        self.store.config.set_tools(list(by_name.values()))
        return self

    def with_handoffs(self, *agents: Any) -> Self:
        """Let the model hand the conversation over to these agents: each is offered as a
        tool (``transfer_to_billing`` for ``Billing``; ``Billing.as_handoff(name=...)``
        names it yourself) whose call switches the chat to that agent from its next model
        call on (docs/handoffs.md)."""
        return self.with_tools(*(_as_handoff_tool(agent) for agent in agents))

    def with_guardrails(self, *guardrails: Any, replace: bool = False) -> Self:
        """Run these guardrails (``agentloop.guardrails``: functions decorated with
        ``@input_guardrail``, ``@output_guardrail`` or ``@tool_guardrail``, or Guardrail
        subclasses) on the chat's user messages, answers and tool calls, each stage's in the
        order given. One named like an earlier one takes its place; ``replace=True`` drops the
        earlier ones (``with_guardrails(replace=True)``: none). A persisted chat keeps their
        import paths."""
        current = [] if replace else list(self.store.config.get_guardrails())
        by_name: dict[str, Guardrail] = {}
        for guardrail in [*current, *(as_guardrail(item) for item in guardrails)]:
            by_name[guardrail.name] = guardrail
        self.store.config.set_guardrails(list(by_name.values()))
        return self

    def with_mcp(
        self,
        server: str,
        only: Iterable[str] | None = None,
        requires_approval: Iterable[str] | bool = (),
    ) -> Self:
        """Offer the tools of MCP server ``server`` (``AGENTLOOP["MCP_SERVERS"]``): all, or
        those named in ``only``; those in ``requires_approval`` wait for ``approve()``."""
        return self.with_tools(*mcp_tools(server, only=only, requires_approval=requires_approval))

    def with_tool_options(
        self,
        *,
        choice: str | None = UNSET,
        calls: str = UNSET,
        concurrency: str | int | None = UNSET,
    ) -> Self:
        """``choice`` ("auto", "none", "required" or a tool name), ``calls`` ("many" or
        "one"), ``concurrency`` (None, "threads" or a pool size)."""
        changes = {
            key: value
            for key, value in {"choice": choice, "calls": calls, "concurrency": concurrency}.items()
            if value is not UNSET
        }
        current = self.store.config.get_config().tool_options.model_dump()
        try:
            options = ToolOptions.model_validate({**current, **changes})
        except ValidationError as exc:
            raise ConfigurationError(f"Invalid tool options: {exc}") from exc
        self.store.config.update_config(tool_options=options)
        return self

    def with_temperature(self, temperature: float | None) -> Self:
        """Sampling temperature (None: the provider's default)."""
        self.store.config.update_config(temperature=temperature)
        return self

    def with_max_output_tokens(self, tokens: int | None) -> Self:
        """Cap the length of each answer."""
        self.store.config.update_config(max_output_tokens=tokens)
        return self

    def with_provider_options(self, **options: Any) -> Self:
        """Raw request fields merged into what the provider is sent."""
        merged = {**self.store.config.get_config().provider_options, **options}
        self.store.config.update_config(provider_options=merged)
        return self

    def with_headers(self, **headers: str) -> Self:
        """Extra HTTP headers for the provider (stored with the chat: no secrets)."""
        merged = {**self.store.config.get_config().headers, **headers}
        self.store.config.update_config(headers=merged)
        return self

    def with_schema(self, schema: type[BaseModel] | dict[str, Any] | None) -> Self:
        """Ask for structured output; answers are parsed into ``message.parsed``."""
        if schema is None:
            self._schema_model = None
            self.store.config.update_config(output_schema=None, schema_path=None)
        elif isinstance(schema, dict):
            self._schema_model = None
            self.store.config.update_config(output_schema=schema, schema_path=None)
        elif isinstance(schema, type) and issubclass(schema, BaseModel):
            self._schema_model = schema
            try:
                path: str | None = import_path_of(schema)
            except ConfigurationError:
                path = None  # parsed in this process only; elsewhere as plain JSON
            self.store.config.update_config(
                output_schema=schema.model_json_schema(), schema_path=path
            )
        else:
            raise ConfigurationError("with_schema() takes a pydantic model class or a JSON schema")
        return self

    def with_caching(self, ttl: str | None = "5m", key: str | None = None) -> Self:
        """Prompt caching: Anthropic breakpoints kept ``ttl`` ("5m" or "1h"), OpenAI's
        ``prompt_cache_key`` (``key``, else one made for this chat and kept); None: off."""
        if ttl is None:
            self.store.config.update_config(caching=None)
            return self
        current = self.store.config.get_config().caching
        key = key or (current.key if current else None) or f"agentloop-{uuid.uuid4().hex}"
        try:
            caching = Caching(ttl=ttl, key=key)
        except ValidationError:
            raise ConfigurationError(
                f"with_caching() takes ttl='5m' or ttl='1h' (or None), not {ttl!r}"
            ) from None
        self.store.config.update_config(caching=caching)
        return self

    def with_thinking(
        self, effort: str | None = "medium", budget_tokens: int | None = None
    ) -> Self:
        """Let the model think: ``effort`` "low", "medium" or "high" (None: off), or a
        ``budget_tokens`` budget where the provider takes one."""
        try:
            thinking = Thinking(effort=effort, budget_tokens=budget_tokens)
        except ValidationError:
            raise ConfigurationError(
                "with_thinking() takes effort 'low', 'medium', 'high' or None and a positive "
                f"budget_tokens, not effort={effort!r}, budget_tokens={budget_tokens!r}"
            ) from None
        self.store.config.update_config(thinking=thinking)
        return self

    def with_context_window(self, tokens: int | None) -> Self:
        """The model's context window in tokens, overriding the catalog's (None: the catalog's)."""
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
        ):
            raise ConfigurationError(
                f"with_context_window() takes a positive number of tokens, not {tokens!r}"
            )
        self.store.config.update_config(context_window=tokens)
        return self

    def with_compaction(
        self, at: float | None = 0.8, keep_recent: int = 8, model: str | None = None
    ) -> Self:
        """Summarise the older messages before a model call once the estimated input passes
        ``at`` x the context window, keeping the last ``keep_recent``; ``at=None``: off."""
        if at is None:
            self.store.config.update_config(compaction=None)
            return self
        if model is not None:
            providers.split_model(model)  # fail now on a model nobody can serve
        try:
            compaction = Compaction(at=at, keep_recent=keep_recent, model=model)
        except ValidationError:
            raise ConfigurationError(
                "with_compaction() takes 0 < at <= 1 and keep_recent >= 1, not "
                f"at={at!r}, keep_recent={keep_recent!r}"
            ) from None
        self.store.config.update_config(compaction=compaction)
        return self

    def with_fallbacks(self, *models: str) -> Self:
        """Models to try, in order, when a call fails in a way retrying can't fix in the step
        (server errors, overload, rate limits, context length); none: no fallbacks."""
        for model in models:
            providers.split_model(model)  # fail now on a model nobody can serve
        self.store.config.update_config(fallbacks=list(models))
        return self

    def with_limits(self, **limits: Any) -> Self:
        """Per-turn budgets: ``max_model_calls``, ``max_tool_calls``, ``max_seconds``,
        ``max_cost``. Given keys replace earlier values; pass None to remove one."""
        current = self.store.config.get_config().limits.model_dump()
        try:
            merged = Limits.model_validate({**current, **limits})
        except ValidationError as exc:
            raise ConfigurationError(f"Invalid limits: {exc}") from exc
        if merged.max_cost is not None and self.store.costs is None:
            raise ConfigurationError(
                f"max_cost needs a store that sums a turn's costs; {type(self.store).__name__} "
                "doesn't (store.costs is None)."
            )
        self.store.config.update_config(limits=merged)
        return self
