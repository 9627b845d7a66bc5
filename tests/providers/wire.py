"""HTTP test doubles shared by the provider tests: a scripted server for httpx.MockTransport,
the answers and failures it serves, and the requests every provider maps."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx

from agentloop import providers
from agentloop.exceptions import CancelledError, ProviderError
from agentloop.messages import Message, ModelRequest, ModelResponse, ToolCall, ToolDefinition
from agentloop.providers.base import ChunkCallback, Provider

Answer = httpx.Response | Callable[[httpx.Request], Any]
P = TypeVar("P", bound=Provider)


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


def answering(provider_class: type[P], *responses: Answer, **options: Any) -> tuple[P, Recorder]:
    """A ``provider_class`` talking to a Recorder that answers ``responses`` in order."""
    recorder = Recorder(*responses)
    return provider_class(transport=recorder.transport(), **options), recorder


@contextmanager
def registered(name: str, provider: Provider) -> Iterator[Provider]:
    """``provider`` registered as ``name`` for the block."""
    providers.register(name, provider)
    try:
        yield provider
    finally:
        providers.unregister(name)


@contextmanager
def serving(name: str, provider_class: type, **options: Any) -> Iterator[Recorder]:
    """A provider of ``provider_class`` registered as ``name``, answering from a Recorder."""
    recorder = Recorder()
    with registered(name, provider_class(name=name, transport=recorder.transport(), **options)):
        yield recorder


def resolved(model: str) -> tuple[Provider, str]:
    """What ``model`` resolves to among the built-in providers (forgotten again after)."""
    try:
        return providers.resolve(model)
    finally:
        providers.forget_configured()


def cancelling(seen: list[Any]) -> ChunkCallback:
    """An ``on_chunk`` that keeps the chunk it is given, then cancels."""

    def cancel(chunk: Any) -> None:
        seen.append(chunk)
        raise CancelledError()

    return cancel


def as_message(response: ModelResponse) -> Message:
    """The assistant message a chat keeps of ``response``, to send back."""
    return Message(
        role="assistant",
        content=response.content,
        tool_calls=response.tool_calls,
        provider_data=response.provider_data,
    )


# -- answers and failures ----------------------------------------------------------------------
def event_stream(text: str) -> httpx.Response:
    """A 200 answer streaming ``text`` as server-sent events."""
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)


def read_timeout(request: httpx.Request) -> httpx.Response:
    """An answer that never comes: the read times out."""
    raise httpx.ReadTimeout("timed out", request=request)


def openai_error(
    status: int, message: str, code: str | None = None, **headers: str
) -> httpx.Response:
    """An OpenAI error envelope (Chat Completions and Responses share it)."""
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return httpx.Response(status, json=body, headers=headers)


def shown(error: ProviderError) -> str:
    """Everything of ``error`` a person or a log could see: its text, repr and body."""
    return " ".join([str(error), repr(error), error.body or ""])


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


# -- requests every provider maps ---------------------------------------------------------------
def conversation(model: str, *turns: tuple[str, str]) -> ModelRequest:
    """A request of ``model`` whose messages are ``(role, content)`` turns."""
    return ModelRequest(
        model=model, messages=[Message(role=role, content=content) for role, content in turns]
    )


def system_messages_around_a_question(model: str) -> ModelRequest:
    """System messages before and after the user's question."""
    return conversation(
        model, ("system", "Be brief."), ("user", "Hi"), ("system", "Answer in French.")
    )


def two_results_then_a_question(
    model: str, call_ids: tuple[str, str], tools: list[ToolDefinition]
) -> ModelRequest:
    """A round of two weather calls (Paris, then Rome), the second result an error, and the
    user's next question."""
    first, second = call_ids
    calls = [
        ToolCall(id=first, name="weather", arguments={"city": "Paris"}),
        ToolCall(id=second, name="weather", arguments={"city": "Rome"}),
    ]
    return ModelRequest(
        model=model,
        messages=[
            Message(role="user", content="Weather?"),
            Message(role="assistant", content="Checking.", tool_calls=calls),
            Message(role="tool", tool_call_id=first, tool_name="weather", content="sunny"),
            Message(
                role="tool",
                tool_call_id=second,
                tool_name="weather",
                content="boom",
                is_error=True,
            ),
            Message(role="user", content="And tomorrow?"),
        ],
        tools=tools,
    )


def an_invalid_call_answered(
    model: str, call: ToolCall, tool_name: str | None = None
) -> ModelRequest:
    """``call`` (whose arguments did not parse) answered by its error result."""
    return ModelRequest(
        model=model,
        messages=[
            Message(role="user", content="Hi"),
            Message(role="assistant", tool_calls=[call]),
            Message(
                role="tool",
                tool_call_id=call.id,
                tool_name=tool_name,
                content="Invalid arguments",
                is_error=True,
            ),
        ],
    )


def an_empty_answer_between_questions(model: str) -> ModelRequest:
    """Two user questions with an empty assistant answer between them."""
    return conversation(model, ("user", "Hi"), ("assistant", ""), ("user", "Hello?"))


def anthropic_answer(text: str, *, signature: str | None = None) -> httpx.Response:
    """An Anthropic Messages answer with ``text`` (and a signed thinking block first)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if signature:
        content.insert(0, {"type": "thinking", "thinking": f"About {text}", "signature": signature})
    return httpx.Response(
        200,
        json={
            "id": "msg_1",
            "model": "claude-haiku-4-5",
            "content": content,
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
    )
