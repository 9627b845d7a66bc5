"""Drive a persisted chat from another process: ``drive_chat.py <chat pk> <spec JSON>``.

The spec says what to do::

    {
      "verb": "complete" | "step" | "generate" | "cancel" | "halt" | "submit_result",
      "replies": [                      # queued on a ScriptedProvider registered as "scripted"
        {"text": "all done"},
        {"tool_calls": [{"id": "c1", "name": "step_one", "arguments": {}}]},
        {"stream": ["Once ", "upon "], "delay": 0.05}
      ],
      "reason": "budget",               # the halt's reason
      "call": "c1", "content": "paid",  # submit_result's call id and content
      "stream": true,                   # pass a stream callback that prints "chunk <n>"
      "settings": {"PARTIAL_SAVE_INTERVAL": 0}   # merged into settings.AGENTLOOP
    }

It prints ``started`` once the chat is loaded, ``chunk <n>`` per streamed chunk, and a last
line ``SUMMARY {json}`` with the returned message and every request the provider got.
Tools in ``tests.tools`` may end the process first (``$AGENTLOOP_TEST_CRASH_IN``); with
``$AGENTLOOP_TEST_KILL_POINTS`` set it stops where a test armed a point (tests/kill_points.py).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import django


def main(chat_pk: int, spec: dict[str, Any]) -> None:
    django.setup()
    if os.environ.get("AGENTLOOP_TEST_KILL_POINTS"):
        from tests.kill_points import install

        install()  # stops where the test armed a point (tests/kill_points.py)
    from django.conf import settings

    from agentloop import providers
    from agentloop.conf import agentloop_settings
    from agentloop.messages import ModelRequest
    from agentloop.models import Chat
    from agentloop.testing import ScriptedProvider, reply, stream, tool_call

    if spec.get("settings"):
        settings.AGENTLOOP = {**getattr(settings, "AGENTLOOP", {}), **spec["settings"]}
        agentloop_settings.reload()

    replies: list[Any] = []
    for item in spec.get("replies", []):
        if "tool_calls" in item:
            calls = [
                tool_call(c["name"], c.get("arguments", {}), id=c["id"]) for c in item["tool_calls"]
            ]
            replies.append(reply(item.get("text", ""), *calls))
        elif "stream" in item:
            replies.append(stream(*item["stream"], delay=item.get("delay", 0.0)))
        else:
            replies.append(reply(item["text"]))
    provider = ScriptedProvider(*replies)
    providers.register("scripted", provider)

    chat = Chat.objects.get(pk=chat_pk)
    print("started", flush=True)
    chunks = 0

    def on_chunk(chunk: Any) -> None:
        nonlocal chunks
        print(f"chunk {chunks}", flush=True)
        chunks += 1

    on_stream = on_chunk if spec.get("stream") else None
    verb = spec["verb"]
    result: Any = None
    if verb == "cancel":
        chat.cancel()
    elif verb == "submit_result":
        from agentloop.runners import wait_for_embedded_jobs

        result = chat.submit_result(spec["call"], spec["content"], error=spec.get("error", False))
        wait_for_embedded_jobs(60)  # a chat a worker left waiting goes on here (embedded)
    elif verb == "halt":
        print(f"halted {chat.halt(spec.get('reason', ''))}", flush=True)
    elif verb == "complete":
        result = chat.complete(stream=on_stream)
    elif verb == "step":
        result = chat.step(stream=on_stream)
    elif verb == "generate":
        result = chat.generate(stream=on_stream)
    else:
        raise SystemExit(f"unknown verb {verb!r}")

    def describe(request: ModelRequest) -> list[dict[str, Any]]:
        return [
            {
                "role": m.role,
                "content": m.content,
                "is_error": m.is_error,
                "tool_call_id": m.tool_call_id,
                "tool_calls": [c.id for c in m.tool_calls],
            }
            for m in request.messages
        ]

    outcome = {
        "result": None if result is None else {"role": result.role, "content": result.content},
        "requests": [describe(request) for request in provider.requests],
        "unused_replies": provider.remaining,
    }
    print("SUMMARY " + json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))
