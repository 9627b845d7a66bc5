"""The Django store's configuration: the chat's model, provider and options read from its
row (``Config``), and its tools and guardrails loaded from the references the row names."""

from __future__ import annotations

from typing import Any

from ..engine import ChatConfig
from ..engine.store import Configuration
from ..guardrails import Guardrail, guardrail_reference, load_guardrail
from ..tools import Tool, load_tool, tool_reference
from .chat_row import ChatRow

__all__ = ["Config"]

# ChatConfig field -> chat column
_CONFIG_COLUMNS = {
    "model": "model",
    "provider": "provider",
    "tool_paths": "tools",
    "tool_options": "tool_options",
    "temperature": "temperature",
    "max_output_tokens": "max_output_tokens",
    "provider_options": "provider_options",
    "headers": "headers",
    "output_schema": "output_schema",
    "schema_path": "schema_path",
    "limits": "limits",
    "caching": "caching",
    "thinking": "thinking",
    "context_window": "context_window",
    "compaction": "compaction",
    "fallbacks": "fallbacks",
    "guardrail_paths": "guardrails",
    "memory": "memory",
}

#: tool classes by the chat's tool references, for every chat of this process.
_LOADED_TOOLS: dict[tuple[str, ...], list[type[Tool]]] = {}
#: guardrails by the chat's guardrail paths, likewise.
_LOADED_GUARDRAILS: dict[tuple[str, ...], list[Guardrail]] = {}


class Config(Configuration):
    """The chat's configuration and tools, read from its row and cached until changed."""

    def __init__(self, row: ChatRow) -> None:
        self.row = row
        self._config: ChatConfig | None = None
        self._tools: tuple[tuple[str, ...], list[type[Tool]]] | None = None
        self._guardrails: tuple[tuple[str, ...], list[Guardrail]] | None = None

    def forget(self) -> None:
        """The row was configured elsewhere (a claim read it): read it again when asked."""
        self._config = None

    def get_config(self) -> ChatConfig:
        # Changes made here go through update_config, which drops the cache; a chat row
        # changed by another process is seen by loading the chat again, as with any model.
        if self._config is None:
            self._config = self._read()
        return self._config

    def _read(self) -> ChatConfig:
        chat = self.row.chat
        return ChatConfig.model_validate(
            {
                "model": chat.model,
                "provider": chat.provider or None,
                "tool_paths": chat.tools or [],
                "tool_options": chat.tool_options or {},
                "temperature": chat.temperature,
                "max_output_tokens": chat.max_output_tokens,
                "provider_options": chat.provider_options or {},
                "headers": chat.headers or {},
                "output_schema": chat.output_schema,
                "schema_path": chat.schema_path or None,
                "limits": chat.limits or {},
                "caching": chat.caching,
                "thinking": chat.thinking,
                "context_window": chat.context_window,
                "compaction": chat.compaction,
                "fallbacks": chat.fallbacks or [],
                "guardrail_paths": chat.guardrails or [],
                "memory": chat.memory,
            }
        )

    def update_config(self, **changes: Any) -> None:
        self._config = None
        columns = []
        for field, value in changes.items():
            column = _CONFIG_COLUMNS[field]
            if hasattr(value, "model_dump"):
                value = value.model_dump(mode="json", exclude_none=True)
            if value is None and column in {"provider", "schema_path"}:
                value = ""
            setattr(self.row.chat, column, value)
            columns.append(column)
        if self.row.chat.pk is None:
            self.row.chat.save()
        else:
            self.row.chat.save(update_fields=[*columns, "updated_at"])

    def set_tools(self, tools: list[Any]) -> None:
        paths = [tool_reference(tool) for tool in tools]
        self.update_config(tool_paths=paths)
        self._tools = (tuple(paths), list(tools))

    def get_tools(self) -> list[type[Tool]]:
        paths = tuple(self.row.chat.tools or ())
        if self._tools is None or self._tools[0] != paths:
            # The chat row names its tools; any process can load them again. Loaded once per
            # process (an agent tool builds its schema), not once per chat object.
            tools = _LOADED_TOOLS.get(paths)
            if tools is None:
                if len(_LOADED_TOOLS) >= 512:
                    _LOADED_TOOLS.clear()
                tools = _LOADED_TOOLS[paths] = [load_tool(path) for path in paths]
            self._tools = (paths, tools)
        return self._tools[1]

    def set_guardrails(self, guardrails: list[Guardrail]) -> None:
        paths = [guardrail_reference(guardrail) for guardrail in guardrails]
        self.update_config(guardrail_paths=paths)
        self._guardrails = (tuple(paths), list(guardrails))

    def get_guardrails(self) -> list[Guardrail]:
        paths = tuple(self.row.chat.guardrails or ())
        if not paths:
            return []
        if self._guardrails is None or self._guardrails[0] != paths:
            # Loaded once per process, like tools: a worker names them again from the row. One
            # that can't be loaded fails the step (ConfigurationError names it): fail closed.
            guardrails = _LOADED_GUARDRAILS.get(paths)
            if guardrails is None:
                if len(_LOADED_GUARDRAILS) >= 512:
                    _LOADED_GUARDRAILS.clear()
                loaded = [load_guardrail(path) for path in paths]
                guardrails = _LOADED_GUARDRAILS[paths] = loaded
            self._guardrails = (paths, guardrails)
        return self._guardrails[1]
