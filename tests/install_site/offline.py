"""The install test's model and tool, copied into the ``startproject`` site as ``mysite/offline``.

Named in the site's settings as ``AGENTLOOP["PROVIDERS"]["offline"]["class"]``, so the shell
that starts the chat and the Celery worker that runs it make the same provider from settings.
"""

from __future__ import annotations

from agentloop import tool
from agentloop.messages import ModelRequest, ModelResponse, ToolCall
from agentloop.providers import ChunkCallback, Provider


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


class OfflineProvider(Provider):
    """Asks for ``add(2, 40)``, then answers with the tool's result."""

    def __init__(self, name: str = "offline") -> None:
        self.name = name

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        latest = request.messages[-1]
        if latest.role == "tool":
            return ModelResponse(content=f"2 + 40 = {latest.content}.", finish_reason="stop")
        call = ToolCall(id="call_add", name="add", arguments={"a": 2, "b": 40})
        return ModelResponse(tool_calls=[call], finish_reason="tool_calls")
