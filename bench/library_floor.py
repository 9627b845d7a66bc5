"""The libraries' floor of bench/in_flight.py: a chat's three jobs done with the libraries alone.

``bench.library_hop`` (bench/celery_app.py) does, per job, what agentloop's step does at the
least, through the same libraries and the same servers, with none of agentloop's code: a
connection from a psycopg pool of the worker's pool size to SELECT the chat's transcript,
given back; for the two model jobs, a streamed POST to the fake server (the fake's latency)
on an ``httpx.Client`` of one connection kept between calls, read with httpx-sse; a
connection again to BEGIN, INSERT the job's message, UPDATE the chat, COMMIT
(bench/sql_floor.py's statements); one ``XADD`` of an event to Redis; the next job enqueued
with Celery. Its wall time against the ideal is what Celery, httpx, psycopg and redis-py
allow in this shape in one process; its CPU per job is what they cost there.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import ssl
import threading
from datetime import UTC, datetime
from typing import Any

__all__ = ["hop"]

_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}

_made = threading.Lock()
_parts: dict[str, Any] = {}


def _resources() -> dict[str, Any]:
    # Made on the first job of each worker process (after prefork's fork), once; the lock
    # only until then (every job asks).
    if _parts:
        return _parts
    with _made:
        if not _parts:
            import httpx
            import psycopg_pool
            import redis
            from django.conf import settings
            from django.db import connection

            from agentloop.models import Chat, Message

            from .sql_floor import floor_sql

            # The worker's connection settings with psycopg's own defaults: its adapters, its
            # cursor (server-side binding), statements prepared after five runs.
            params = connection.get_connection_params()
            for django_default in ("cursor_factory", "context", "prepare_threshold"):
                params.pop(django_default, None)
            pool_size = json.loads(os.environ.get("BENCH_DB_POOL") or "{}").get("max_size", 10)
            columns = [field.column for field in Message._meta.concrete_fields]
            base_url = settings.AGENTLOOP["PROVIDERS"]["openai"]["base_url"]
            _parts.update(
                pool=psycopg_pool.ConnectionPool(
                    kwargs={**params, "autocommit": True},
                    min_size=min(2, pool_size),
                    max_size=pool_size,
                    timeout=120,
                    open=True,
                ),
                http=functools.partial(
                    httpx.Client,
                    base_url=base_url,
                    limits=httpx.Limits(max_connections=1),
                    headers={"Authorization": "Bearer x"},
                    verify=ssl.create_default_context(),  # one for all, as agentloop's lanes
                ),
                idle=collections.deque(),
                redis=redis.Redis.from_url(settings.AGENTLOOP["REDIS_URL"]),
                sql=floor_sql(Message._meta.db_table, Chat._meta.db_table, columns),
            )
        return _parts


def _model_call(parts: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed chat completion from the fake server: the message its chunks make. Each
    call takes an idle client of one connection, or makes one, and gives it back after (as
    agentloop's lanes do: one client's pool of hundreds costs work per call growing with
    them)."""
    from httpx_sse import connect_sse

    try:
        http = parts["idle"].pop()
    except IndexError:
        http = parts["http"]()
    body = {"model": "fake", "stream": True, "messages": messages, "tools": [_TOOL]}
    try:
        return _streamed(connect_sse(http, "POST", "/chat/completions", json=body))
    finally:
        parts["idle"].append(http)


def _streamed(sse: Any) -> dict[str, Any]:  # the SSE events into the message
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    with sse as source:
        source.response.raise_for_status()
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            for choice in json.loads(event.data).get("choices", ()):
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                calls.extend(delta.get("tool_calls") or ())
    return {"content": "".join(content), "tool_calls": calls}


def hop(chat_pk: int, remaining: int) -> None:
    """One job of a chat's three (3: ask the model, 2: the tool, 1: the model's answer)."""
    parts = _resources()
    select, insert, update = parts["sql"]
    with parts["pool"].connection() as connection:
        rows = connection.execute(select, (chat_pk,)).fetchall()
    question = f"chat {chat_pk}, {len(rows)} rows"
    if remaining == 3:
        message = _model_call(parts, [{"role": "user", "content": question}])
        role, content = "assistant", message["content"]
    elif remaining == 2:
        role, content = "tool", f"value of {question}"
    else:
        function = {"name": "lookup", "arguments": json.dumps({"key": question})}
        call = {"id": "c1", "type": "function", "function": function}
        messages = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": f"value of {question}"},
        ]
        role, content = "assistant", _model_call(parts, messages)["content"]
    now = datetime.now(UTC)
    with parts["pool"].connection() as connection, connection.transaction():
        connection.execute(insert, (chat_pk, role, content, "fake", "stop", now)).fetchone()
        connection.execute(update, (now, chat_pk))
    parts["redis"].xadd(f"bench:floor:{chat_pk}", {"role": role}, maxlen=100, approximate=True)
