"""One MCP server's entry in ``AGENTLOOP["MCP_SERVERS"]``, read and checked."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ...conf import agentloop_settings
from ...exceptions import ConfigurationError

__all__ = ["DEFAULT_ELICITATION_TIMEOUT", "DEFAULT_TIMEOUT", "ServerSettings", "server_settings"]

#: seconds to connect, and seconds one call may take, when the server's entry names none.
DEFAULT_TIMEOUT = 30.0
#: seconds a server's question (an elicitation) waits for a person by default.
DEFAULT_ELICITATION_TIMEOUT = 600.0


class ServerSettings(BaseModel):
    """How to reach one server: a command (stdio) or a URL (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the server's command line, started as a subprocess that speaks MCP on stdin/stdout.
    command: list[str] | None = Field(default=None, min_length=1)
    #: environment variables of that subprocess, over a minimal default (PATH, HOME, ...).
    env: dict[str, str] = Field(default_factory=dict)
    #: working directory of that subprocess.
    cwd: str | None = None
    #: the streamable HTTP endpoint (e.g. "http://127.0.0.1:8000/mcp").
    url: str | None = None
    #: HTTP headers sent to that endpoint (e.g. an Authorization header).
    headers: dict[str, str] = Field(default_factory=dict)
    #: seconds one tool call (or the listing of the tools) may take.
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0)
    #: seconds to start and connect (a stdio server may need a while to start).
    connect_timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0)
    #: whether the server may ask a person for input (MCP elicitation) during a call; its
    #: calls then take a session each, so a question is always known to be a call's.
    elicitation: bool = False
    #: seconds such a question waits for a person before it is answered "cancel".
    elicitation_timeout: float = Field(default=DEFAULT_ELICITATION_TIMEOUT, gt=0)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give 'command' (stdio) or 'url' (streamable HTTP), one of the two")
        return self

    @property
    def key(self) -> str:
        """Identifies this configuration: a changed entry gets a connection of its own."""
        return json.dumps(self.model_dump(), sort_keys=True)


def server_settings(name: str) -> ServerSettings:
    """The checked entry of server ``name``; a clear one-line ConfigurationError otherwise."""
    servers: Any = agentloop_settings.MCP_SERVERS
    if not isinstance(servers, dict):
        raise ConfigurationError("AGENTLOOP['MCP_SERVERS'] must be a dict of server names.")
    if name not in servers:
        known = ", ".join(sorted(servers)) or "none"
        raise ConfigurationError(
            f"MCP server {name!r} is not in AGENTLOOP['MCP_SERVERS'] (configured: {known})."
        )
    try:
        return ServerSettings.model_validate(servers[name])
    except ValidationError as exc:
        # Values are left out of the message: an env or headers entry may hold a secret.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'entry'}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)
        )
        raise ConfigurationError(
            f"AGENTLOOP['MCP_SERVERS'][{name!r}] is invalid: {problems}"
        ) from None
