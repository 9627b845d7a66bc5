"""The providers' batch APIs on fixtures written here: what each vendor's results, errors and
statuses become, and which providers have batches. (The recorded traffic is replayed in
test_batch_replay.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

from agentloop.exceptions import (
    AuthenticationError,
    BadRequestError,
    BatchError,
    BatchItemNotRunError,
    InvalidResponseError,
    ProviderError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import Message, ModelRequest, ModelResponse
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.batch_apis import (
    AnthropicBatchAPI,
    GeminiBatchAPI,
    OpenAIBatchAPI,
    batch_api,
)
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import OllamaProvider, OpenAIProvider, OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.wire import Recorder, chat_completion

KEY = "sk-test-0123456789abcdef"


def request(text: str = "hi", model: str = "gpt-5-nano", **fields) -> ModelRequest:
    return ModelRequest(model=model, messages=[Message(role="user", content=text)], **fields)


def jsonl(*lines: dict) -> httpx.Response:
    return httpx.Response(200, text="\n".join(json.dumps(line) for line in lines) + "\n")


# -- which providers have batches --------------------------------------------------------------
def test_the_vendor_providers_have_batch_apis():
    assert isinstance(batch_api(OpenAIProvider(api_key=KEY)), OpenAIBatchAPI)
    assert isinstance(batch_api(OpenAIResponsesProvider(api_key=KEY)), OpenAIBatchAPI)
    assert isinstance(batch_api(AnthropicProvider(api_key=KEY)), AnthropicBatchAPI)
    assert isinstance(batch_api(GeminiProvider(api_key=KEY)), GeminiBatchAPI)


def test_openai_compatible_servers_have_none_unless_configured(settings):
    assert batch_api(OpenRouterProvider(api_key=KEY)) is None
    assert batch_api(OllamaProvider()) is None
    assert batch_api(OpenAIProvider(api_key=KEY, base_url="http://localhost:8000/v1")) is None
    settings.AGENTLOOP = {**settings.AGENTLOOP, "PROVIDERS": {"vllm": {"batches": True}}}
    served = OpenAIProvider(name="vllm", api_key=KEY, base_url="http://localhost:8000/v1")
    assert isinstance(batch_api(served), OpenAIBatchAPI)


def test_a_provider_of_your_own_offers_batches_with_a_batch_api_method():
    class Mine(AnthropicProvider):
        def batch_api(self):
            return "mine"

    assert batch_api(Mine(api_key=KEY)) == "mine"


def test_only_anthropic_batches_mix_models():
    assert batch_api(AnthropicProvider(api_key=KEY)).mixed_models
    assert not batch_api(OpenAIProvider(api_key=KEY)).mixed_models
    assert not batch_api(GeminiProvider(api_key=KEY)).mixed_models


# -- OpenAI ----------------------------------------------------------------------------------
def test_openai_chat_completions_lines_go_to_the_chat_completions_endpoint():
    server = Recorder(
        httpx.Response(200, json={"id": "file-in"}),
        httpx.Response(200, json={"id": "batch_1", "status": "validating"}),
    )
    api = batch_api(OpenAIProvider(api_key=KEY, transport=server.transport()))

    # gpt-4.1-nano: a model that takes a temperature (gpt-5-nano refuses one, see test_catalog).
    hot = request("hi", model="gpt-4.1-nano", temperature=0.5)
    info = api.submit([("0", hot), ("1", request("yo", model="gpt-4.1-nano"))])

    upload, create = server.requests
    assert str(upload.url) == "https://api.openai.com/v1/files"
    assert b'name="purpose"\r\n\r\nbatch' in upload.content
    body = upload.content.decode()
    items = [json.loads(line) for line in body.splitlines() if line.startswith("{")]
    assert [(i["custom_id"], i["method"], i["url"]) for i in items] == [
        ("0", "POST", "/v1/chat/completions"),
        ("1", "POST", "/v1/chat/completions"),
    ]
    assert items[0]["body"] == {
        "model": "gpt-4.1-nano",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
    }  # the provider's own body, without "stream"
    assert json.loads(create.content) == {
        "input_file_id": "file-in",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    assert upload.headers["authorization"] == f"Bearer {KEY}"
    assert (info.id, info.status) == ("batch_1", "in_progress")


def test_openai_results_come_from_the_output_and_error_files():
    status = {
        "id": "batch_1",
        "status": "completed",
        "output_file_id": "file-out",
        "error_file_id": "file-err",
        "request_counts": {"total": 4, "completed": 2, "failed": 2},
    }
    answer = chat_completion("Paris", prompt_tokens=10, completion_tokens=2).json()
    server = Recorder(
        httpx.Response(200, json=status),
        jsonl(
            {"custom_id": "0", "response": {"status_code": 200, "body": answer}, "error": None},
            {
                "custom_id": "1",
                "response": {
                    "status_code": 400,
                    "body": {"error": {"message": "bad schema", "type": "invalid_request_error"}},
                },
                "error": None,
            },
        ),
        jsonl(
            {
                "custom_id": "2",
                "response": None,
                "error": {"code": "batch_expired", "message": "not run in time"},
            },
            {
                "custom_id": "3",
                "response": None,
                "error": {"code": "rate_limit_exceeded", "message": "slow down"},
            },
        ),
    )
    api = batch_api(OpenAIProvider(api_key=KEY, transport=server.transport()))

    results = api.results("batch_1")

    assert [str(r.url) for r in server.requests[1:]] == [
        "https://api.openai.com/v1/files/file-out/content",
        "https://api.openai.com/v1/files/file-err/content",
    ]
    assert isinstance(results["0"], ModelResponse) and results["0"].content == "Paris"
    assert results["0"].usage.input_tokens == 10
    assert isinstance(results["1"], BadRequestError) and "bad schema" in str(results["1"])
    assert isinstance(results["2"], BatchItemNotRunError)
    assert isinstance(results["3"], RateLimitError)


@pytest.mark.parametrize(
    ("vendor_status", "ours"),
    [
        ("validating", "in_progress"),
        ("in_progress", "in_progress"),
        ("finalizing", "in_progress"),
        ("completed", "ended"),
        ("failed", "failed"),
        ("expired", "expired"),
        ("cancelling", "cancelling"),
        ("cancelled", "cancelled"),
    ],
)
def test_openai_statuses(vendor_status, ours):
    payload = {"id": "b", "status": vendor_status, "request_counts": {"total": 3, "completed": 1}}
    server = Recorder(httpx.Response(200, json=payload))
    info = batch_api(OpenAIResponsesProvider(api_key=KEY, transport=server.transport())).status("b")
    assert info.status == ours
    assert (info.request_count, info.succeeded_count, info.processing_count) == (3, 1, 2)


def test_a_refused_openai_batch_says_why():
    payload = {
        "id": "b",
        "status": "failed",
        "errors": {"data": [{"code": "invalid_json_line", "message": "Line 2 is not JSON."}]},
    }
    server = Recorder(httpx.Response(200, json=payload))
    info = batch_api(OpenAIProvider(api_key=KEY, transport=server.transport())).status("b")
    assert (info.status, info.finished, info.error) == ("failed", True, "Line 2 is not JSON.")


# -- Anthropic ---------------------------------------------------------------------------------
def test_anthropic_results_map_errored_canceled_and_expired_requests():
    message = {
        "content": [{"type": "text", "text": "4"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 20, "output_tokens": 5},
    }
    server = Recorder(
        jsonl(
            {"custom_id": "a", "result": {"type": "succeeded", "message": message}},
            {
                "custom_id": "b",
                "result": {
                    "type": "errored",
                    "error": {
                        "type": "error",
                        "error": {"type": "overloaded_error", "message": "Overloaded"},
                    },
                },
            },
            {"custom_id": "c", "result": {"type": "canceled"}},
            {"custom_id": "d", "result": {"type": "expired"}},
        )
    )
    api = batch_api(AnthropicProvider(api_key=KEY, transport=server.transport()))

    results = api.results("msgbatch_1")

    assert str(server.requests[0].url) == (
        "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results"
    )
    assert server.requests[0].headers["x-api-key"] == KEY
    assert results["a"].content == "4" and results["a"].usage.output_tokens == 5
    assert isinstance(results["b"], ServerError) and "Overloaded" in str(results["b"])
    assert isinstance(results["c"], BatchItemNotRunError)
    assert isinstance(results["d"], BatchItemNotRunError)


def test_an_anthropic_batch_ended_after_a_cancel_is_cancelled():
    payload = {
        "id": "msgbatch_1",
        "processing_status": "ended",
        "cancel_initiated_at": "2026-08-19T14:49:30Z",
        "request_counts": {"processing": 0, "succeeded": 1, "canceled": 2},
    }
    server = Recorder(httpx.Response(200, json=payload))
    info = batch_api(AnthropicProvider(api_key=KEY, transport=server.transport())).status("x")
    assert (info.status, info.request_count, info.succeeded_count, info.failed_count) == (
        "cancelled",
        3,
        1,
        2,
    )


def test_requests_of_one_batch_must_send_the_same_headers():
    api = batch_api(AnthropicProvider(api_key=KEY, transport=Recorder().transport()))
    with pytest.raises(BatchError, match="same headers"):
        api.submit(
            [
                ("0", request(model="claude-haiku-4-5", headers={"anthropic-beta": "a"})),
                ("1", request(model="claude-haiku-4-5")),
            ]
        )


def test_an_http_error_from_a_batch_endpoint_is_the_usual_provider_error():
    server = Recorder(
        httpx.Response(401, json={"type": "error", "error": {"type": "authentication_error"}})
    )
    api = batch_api(AnthropicProvider(api_key=KEY, transport=server.transport()))
    with pytest.raises(AuthenticationError) as caught:
        api.status("msgbatch_1")
    assert KEY not in str(caught.value) and KEY not in repr(caught.value)


# -- Gemini ------------------------------------------------------------------------------------
def test_gemini_batches_hold_one_model():
    api = batch_api(GeminiProvider(api_key=KEY, transport=Recorder().transport()))
    with pytest.raises(BatchError, match="one model"):
        api.submit(
            [("0", request(model="gemini-2.5-flash")), ("1", request(model="gemini-2.5-pro"))]
        )


def test_gemini_inline_results_map_answers_and_errors():
    operation = {
        "name": "batches/abc",
        "metadata": {"state": "BATCH_STATE_SUCCEEDED", "batchStats": {"requestCount": "2"}},
        "done": True,
        "response": {
            "inlinedResponses": {
                "inlinedResponses": [
                    {
                        "response": {
                            "candidates": [
                                {"content": {"parts": [{"text": "Hi"}]}, "finishReason": "STOP"}
                            ],
                            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1},
                        },
                        "metadata": {"custom_id": "0"},
                    },
                    {
                        "error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"},
                        "metadata": {"custom_id": "1"},
                    },
                ]
            }
        },
    }
    server = Recorder(httpx.Response(200, json=operation))
    api = batch_api(GeminiProvider(api_key=KEY, transport=server.transport()))

    results = api.results("batches/abc")

    assert str(server.requests[0].url) == (
        "https://generativelanguage.googleapis.com/v1beta/batches/abc"
    )
    assert server.requests[0].headers["x-goog-api-key"] == KEY
    assert results["0"].content == "Hi"
    assert isinstance(results["1"], RateLimitError)


def test_a_failed_gemini_batch_says_why():
    operation = {
        "name": "batches/abc",
        "metadata": {"state": "BATCH_STATE_FAILED"},
        "done": True,
        "error": {"code": 400, "message": "Request payload size exceeds the limit"},
    }
    server = Recorder(httpx.Response(200, json=operation))
    info = batch_api(GeminiProvider(api_key=KEY, transport=server.transport())).status(
        "batches/abc"
    )
    assert (info.status, info.error) == ("failed", "Request payload size exceeds the limit")


def test_cancelling_a_gemini_batch_posts_to_its_cancel_action():
    server = Recorder(httpx.Response(200, json={}))
    api = batch_api(GeminiProvider(api_key=KEY, transport=server.transport()))

    assert api.cancel("batches/abc") is None
    assert (server.requests[0].method, str(server.requests[0].url)) == (
        "POST",
        "https://generativelanguage.googleapis.com/v1beta/batches/abc:cancel",
    )


# -- the batch price ---------------------------------------------------------------------------
def test_the_batch_price_is_half_the_providers_price():
    from decimal import Decimal

    from agentloop.messages import TokenUsage

    api = batch_api(OpenAIProvider(api_key=KEY))
    usage = TokenUsage(input_tokens=2_000_000, output_tokens=1_000_000)
    full = OpenAIProvider(api_key=KEY).cost("gpt-5-nano", usage)

    assert full == Decimal("0.50000000")  # 2 × 0.05 + 1 × 0.4
    assert api.cost("gpt-5-nano", usage) == Decimal("0.25000000")


def test_a_malformed_line_fails_only_its_own_request():
    """One broken line of a results file must not hold back the other answers."""
    message = {
        "content": [{"type": "text", "text": "4"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 20, "output_tokens": 5},
    }
    good = json.dumps({"custom_id": "a", "result": {"type": "succeeded", "message": message}})
    broken = '{"custom_id": "b", "result": {"type": "succeeded", "message": {"content": [{'
    odd = json.dumps({"custom_id": "c", "result": {"type": "succeeded", "message": 7}})
    nameless = "not json at all"
    body = "\n".join([good, broken, odd, nameless]) + "\n"
    server = Recorder(httpx.Response(200, text=body))
    api = batch_api(AnthropicProvider(api_key=KEY, transport=server.transport()))

    results = api.results("msgbatch_1")

    assert results["a"].content == "4"
    assert isinstance(results["b"], InvalidResponseError)
    assert "line 2 of the batch results can't be read" in str(results["b"])
    assert isinstance(results["c"], ProviderError)
    assert set(results) == {"a", "b", "c"}  # a line with no custom id names no request
