"""Prompt caching (``with_caching``) in each vendor's terms.

Anthropic caches a prompt prefix up to each ``cache_control`` breakpoint: we set one on the
last tool, the last system block and the latest message (three of the four allowed), so the
tools and instructions are read from the cache on every call and the conversation so far
from the second call of a turn on. OpenAI caches prefixes by itself; ``prompt_cache_key``
routes requests that share it to the same cache, so a chat's calls hit it more often.
"""

from __future__ import annotations

from typing import Any

from ..messages import Caching

__all__ = ["MAX_BREAKPOINTS", "add_anthropic_breakpoints", "cache_control"]

#: the most ``cache_control`` breakpoints one Anthropic request may carry.
MAX_BREAKPOINTS = 4

# Blocks the API refuses a breakpoint on (thinking is cached along with what follows it).
_NOT_CACHEABLE = frozenset({"thinking", "redacted_thinking"})


def cache_control(caching: Caching) -> dict[str, str]:
    """Anthropic's breakpoint marker: 5 minutes is the API's default and is left unsaid."""
    if caching.ttl == "1h":
        return {"type": "ephemeral", "ttl": "1h"}
    return {"type": "ephemeral"}


def _mark_last(blocks: list[dict[str, Any]], marker: dict[str, str]) -> int:
    """Put ``marker`` on the last block that takes one; 1 if one did, else 0."""
    for block in reversed(blocks):
        if block.get("type") not in _NOT_CACHEABLE:
            block["cache_control"] = dict(marker)
            return 1
    return 0


def _existing(body: dict[str, Any]) -> int:
    """Breakpoints already in the body (set by hand through provider options)."""
    blocks = [*body.get("tools", ()), *body.get("system", ())]
    for message in body.get("messages", ()):
        content = message.get("content")
        if isinstance(content, list):
            blocks.extend(content)
    return sum(1 for block in blocks if isinstance(block, dict) and "cache_control" in block)


def add_anthropic_breakpoints(body: dict[str, Any], caching: Caching) -> dict[str, Any]:
    """``body`` (a Messages API body, changed in place) with breakpoints on the last tool,
    the last system block and the latest message, within the API's limit of four."""
    marker = cache_control(caching)
    room = MAX_BREAKPOINTS - _existing(body)
    targets = [body.get("tools"), body.get("system")]
    messages = body.get("messages") or []
    if messages and isinstance(messages[-1].get("content"), list):
        targets.append(messages[-1]["content"])
    for blocks in targets:
        if room > 0 and blocks:
            room -= _mark_last(blocks, marker)
    return body
