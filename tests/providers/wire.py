"""HTTP test doubles shared by the provider tests: a scripted server for httpx.MockTransport."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from agentloop import providers

Answer = httpx.Response | Callable[[httpx.Request], Any]


class Recorder:
    """A MockTransport handler answering from a list, keeping what was sent.

    An answer is an ``httpx.Response`` or a function of the request (which may raise,
    e.g. ``httpx.ReadTimeout``, or return a response).
    """

    def __init__(self, *responses: Answer) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.responses.pop(0)
        return answer(request) if callable(answer) else answer

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(request.content) for request in self.requests]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


@contextmanager
def serving(name: str, provider_class: type, **options: Any) -> Iterator[Recorder]:
    """A provider of ``provider_class`` registered as ``name``, answering from a Recorder."""
    recorder = Recorder()
    providers.register(name, provider_class(name=name, transport=recorder.transport(), **options))
    try:
        yield recorder
    finally:
        providers.unregister(name)


def chat_completion(
    content: str = "Hello!", *, model: str = "gpt-5-nano", **usage: Any
) -> httpx.Response:
    """A Chat Completions answer with ``usage`` (e.g. prompt_tokens=10, completion_tokens=5)."""
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        },
    )
