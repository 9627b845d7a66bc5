"""BedrockProvider's own behaviour beyond the recordings: SigV4 headers with fixed
credentials and clock, secrets kept out of sight, settings, stream exception events,
errors, the async path, prices, and a missing botocore."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import sys
import zlib
from decimal import Decimal
from typing import Any

import httpx
import pytest
import time_machine
from django.test import override_settings

from agentloop import providers
from agentloop.exceptions import (
    AuthenticationError,
    ConfigurationError,
    ContextLengthError,
    InvalidResponseError,
    ProviderError,
    RateLimitError,
    ServerError,
    StreamInterruptedError,
)
from agentloop.messages import Message, ModelRequest, TextDelta, TokenUsage
from agentloop.providers.bedrock import BedrockProvider, base_model
from tests.providers.aws import ACCESS_KEY, REGION, SECRET_KEY, SESSION_TOKEN
from tests.providers.wire import Recorder, shown

pytestmark = pytest.mark.usefixtures("aws_env")

MODEL = "us.amazon.nova-2-lite-v1:0"
ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "Hi!"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7},
}


def ask(text: str = "Hello", model: str = MODEL, **fields: Any) -> ModelRequest:
    return ModelRequest(model=model, messages=[Message(role="user", content=text)], **fields)


def answering(*responses: Any, **options: Any) -> tuple[BedrockProvider, Recorder]:
    recorder = Recorder(*responses)
    return BedrockProvider(transport=recorder.transport(), **options), recorder


# -- event-stream frames, built here from the format's definition -----------------------------
def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        bytes([len(raw_name)]) + raw_name + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value
    )


def frame(headers: dict[str, str], payload: dict[str, Any]) -> bytes:
    """One ``application/vnd.amazon.eventstream`` message (prelude, headers, payload, CRCs)."""
    head = b"".join(_header(name, value) for name, value in headers.items())
    body = json.dumps(payload).encode()
    total = 12 + len(head) + len(body) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + head + body
    return message + struct.pack(">I", zlib.crc32(message))


def event(kind: str, payload: dict[str, Any]) -> bytes:
    return frame(
        {":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
        payload,
    )


def exception(kind: str, message: str) -> bytes:
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return frame(headers, {"message": message})


def stream(*frames: bytes) -> httpx.Response:
    return httpx.Response(
        200,
        headers={"content-type": "application/vnd.amazon.eventstream"},
        content=b"".join(frames),
    )


HELLO = [
    event("messageStart", {"role": "assistant"}),
    event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
    event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "lo"}}),
    event("contentBlockStop", {"contentBlockIndex": 0}),
    event("messageStop", {"stopReason": "end_turn"}),
    event("metadata", {"usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}}),
]


# -- SigV4 ------------------------------------------------------------------------------------
@time_machine.travel("2026-08-19 14:34:37+00:00", tick=False)
def test_requests_are_signed_with_sigv4_for_bedrock_in_the_region() -> None:
    provider, recorder = answering(httpx.Response(200, json=ANSWER))

    provider.request(ask())

    sent = recorder.requests[0]
    assert str(sent.url) == (
        f"https://bedrock-runtime.{REGION}.amazonaws.com/model/us.amazon.nova-2-lite-v1%3A0/converse"
    )
    assert sent.headers["x-amz-date"] == "20260819T143437Z"
    authorization = sent.headers["authorization"]
    assert authorization.startswith(
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260819/{REGION}/bedrock/aws4_request, "
    )
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert {"content-type", "host", "x-amz-date"} <= set(signed)
    assert "x-amz-security-token" not in sent.headers
    assert len(authorization.rpartition("Signature=")[2]) == 64


@time_machine.travel("2026-08-19 14:34:37+00:00", tick=False)
def test_the_signature_covers_the_body() -> None:
    provider, recorder = answering(*(httpx.Response(200, json=ANSWER) for _ in range(3)))

    provider.request(ask("Hello"))
    provider.request(ask("Hello"))
    provider.request(ask("Hello!"))

    signatures = [r.headers["authorization"].rpartition("Signature=")[2] for r in recorder.requests]
    assert signatures[0] == signatures[1] != signatures[2]


def test_a_session_token_is_sent_and_signed(aws_env: pytest.MonkeyPatch) -> None:
    aws_env.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    provider, recorder = answering(httpx.Response(200, json=ANSWER))

    provider.request(ask())

    sent = recorder.requests[0]
    assert sent.headers["x-amz-security-token"] == SESSION_TOKEN
    assert "x-amz-security-token" in sent.headers["authorization"]


def test_no_secret_in_reprs_logs_or_errors(
    aws_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    aws_env.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    body = {"message": f"bad request echoing {SECRET_KEY} and {SESSION_TOKEN}"}
    provider, _ = answering(
        httpx.Response(400, json=body, headers={"x-amzn-errortype": "ValidationException:x"})
    )
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as raised:
        provider.request(ask())

    seen = " ".join([shown(raised.value), repr(provider), repr(provider.auth), caplog.text])
    assert "botocore" in caplog.text  # its debug logging did run
    assert SECRET_KEY not in seen
    assert SESSION_TOKEN not in seen
    assert "[redacted]" in str(raised.value.body)


def test_no_credentials_is_an_authentication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    provider, recorder = answering()

    with pytest.raises(AuthenticationError, match="no AWS credentials"):
        provider.request(ask())
    assert recorder.requests == []


def test_a_bedrock_api_key_is_sent_as_a_bearer_token_unsigned(aws_env: pytest.MonkeyPatch) -> None:
    aws_env.setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-api-key-123")
    provider, recorder = answering(httpx.Response(200, json=ANSWER))

    provider.request(ask())

    assert recorder.requests[0].headers["authorization"] == "Bearer bedrock-api-key-123"
    assert "x-amz-date" not in recorder.requests[0].headers


# -- settings ---------------------------------------------------------------------------------
def test_region_and_endpoint_url_from_settings(aws_env: pytest.MonkeyPatch) -> None:
    aws_env.delenv("AWS_REGION")
    settings = {"bedrock": {"region": "eu-west-3", "endpoint_url": "https://vpce-1.example/"}}
    with override_settings(AGENTLOOP={"PROVIDERS": settings}):
        provider, recorder = answering(httpx.Response(200, json=ANSWER))
        provider.request(ask())

    sent = recorder.requests[0]
    assert str(sent.url).startswith("https://vpce-1.example/model/")
    assert "/eu-west-3/bedrock/aws4_request" in sent.headers["authorization"]


def test_the_region_from_aws_default_region(aws_env: pytest.MonkeyPatch) -> None:
    aws_env.delenv("AWS_REGION")
    aws_env.setenv("AWS_DEFAULT_REGION", "ap-southeast-2")

    assert BedrockProvider().base_url == "https://bedrock-runtime.ap-southeast-2.amazonaws.com"


def test_no_region_is_a_configuration_error_naming_the_settings(
    aws_env: pytest.MonkeyPatch,
) -> None:
    aws_env.delenv("AWS_REGION")
    provider = BedrockProvider()

    with pytest.raises(
        ConfigurationError, match=r"AGENTLOOP\['PROVIDERS'\]\['bedrock'\]\['region'\]"
    ):
        provider.request(ask())
    assert "bedrock" in repr(provider)  # a repr never fails


def test_bedrock_is_a_builtin_provider() -> None:
    try:
        provider, model = providers.resolve("bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0")
    finally:
        providers.forget_configured()
    assert isinstance(provider, BedrockProvider)
    assert model == "us.anthropic.claude-haiku-4-5-20251001-v1:0"


def test_a_missing_botocore_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in [
        name for name in sys.modules if name == "botocore" or name.startswith("botocore.")
    ]:
        monkeypatch.setitem(sys.modules, module, None)  # import botocore... fails

    with pytest.raises(ConfigurationError, match=r'pip install "django-agentloop\[bedrock\]"'):
        BedrockProvider()


# -- streams ----------------------------------------------------------------------------------
def test_a_stream_split_anywhere_parses_the_same() -> None:
    body = b"".join(HELLO)

    def in_pieces(request: httpx.Request) -> httpx.Response:
        pieces = [body[i : i + 7] for i in range(0, len(body), 7)]  # frames cut mid-header
        return httpx.Response(200, content=iter(pieces))

    provider, _ = answering(in_pieces)
    chunks: list[Any] = []

    response = provider.request(ask(stream=True), on_chunk=chunks.append)

    assert response.content == "Hello"
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["Hel", "lo"]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("throttlingException", RateLimitError),
        ("modelStreamErrorException", ServerError),
        ("internalServerException", ServerError),
        ("serviceUnavailableException", ServerError),
        ("validationException", ProviderError),
    ],
)
def test_exception_events_mid_stream_raise_the_matching_error(
    kind: str, error: type[ProviderError]
) -> None:
    provider, _ = answering(stream(*HELLO[:2], exception(kind, "Too many tokens, please wait.")))
    chunks: list[Any] = []

    with pytest.raises(error) as raised:
        provider.request(ask(stream=True), on_chunk=chunks.append)

    assert f"mid-stream ({kind})" in str(raised.value)
    assert [c.text for c in chunks] == ["Hel"]  # what came before the exception


def test_a_context_length_exception_mid_stream_feeds_compaction() -> None:
    message = "Input is too long for requested model."
    provider, _ = answering(stream(exception("validationException", message)))

    with pytest.raises(ContextLengthError):
        provider.request(ask(stream=True), on_chunk=lambda chunk: None)


def test_a_stream_cut_before_message_stop_is_interrupted() -> None:
    provider, _ = answering(stream(*HELLO[:3]))

    with pytest.raises(StreamInterruptedError, match="messageStop"):
        provider.request(ask(stream=True), on_chunk=lambda chunk: None)


def test_a_corrupt_frame_is_an_invalid_response() -> None:
    broken = bytearray(HELLO[1])
    broken[-1] ^= 0xFF  # the message CRC no longer matches
    provider, _ = answering(stream(HELLO[0], bytes(broken)))

    with pytest.raises(InvalidResponseError, match="event-stream frame"):
        provider.request(ask(stream=True), on_chunk=lambda chunk: None)


# -- errors -----------------------------------------------------------------------------------
def amz_error(status: int, kind: str, message: str, **headers: str) -> httpx.Response:
    headers["x-amzn-errortype"] = f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    return httpx.Response(status, json={"message": message}, headers=headers)


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (
            amz_error(429, "ThrottlingException", "Too many requests", **{"retry-after": "3"}),
            RateLimitError,
        ),
        (
            amz_error(403, "AccessDeniedException", "You don't have access to the model"),
            AuthenticationError,
        ),
        (
            amz_error(
                403,
                "ExpiredTokenException",
                "The security token included in the request is expired",
            ),
            AuthenticationError,
        ),
        (
            amz_error(
                400, "ValidationException", "prompt is too long: 210000 tokens > 200000 maximum"
            ),
            ContextLengthError,
        ),
        (amz_error(503, "ServiceUnavailableException", "Service unavailable"), ServerError),
        (amz_error(500, "InternalServerException", "Internal error"), ServerError),
    ],
)
def test_http_errors_map_to_the_taxonomy(
    response: httpx.Response, error: type[ProviderError]
) -> None:
    provider, _ = answering(response)

    with pytest.raises(error) as raised:
        provider.request(ask())

    kind = response.headers["x-amzn-errortype"].partition(":")[0]
    assert f"({kind})" in str(raised.value)
    if error is RateLimitError:
        assert raised.value.retry_after == 3.0


def test_a_validation_exception_that_is_not_about_length_stays_a_bad_request() -> None:
    provider, _ = answering(
        amz_error(400, "ValidationException", "The model returned the following errors: bad schema")
    )

    with pytest.raises(ProviderError) as raised:
        provider.request(ask())

    assert not isinstance(raised.value, ContextLengthError)


# -- async --------------------------------------------------------------------------------------
def test_arequest_signs_and_streams_through_the_same_code() -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return stream(*HELLO)

    provider = BedrockProvider(transport=httpx.MockTransport(handler))
    chunks: list[Any] = []

    async def collect(chunk: Any) -> None:
        chunks.append(chunk)

    response = asyncio.run(provider.arequest(ask(stream=True), on_chunk=collect))

    assert response.content == "Hello"
    assert "".join(c.text for c in chunks) == "Hello"
    assert seen[0].url.path.endswith("/converse-stream")
    assert seen[0].headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=")


# -- prices ----------------------------------------------------------------------------------------
def test_geographic_profiles_are_priced_as_their_base_model() -> None:
    assert (
        base_model("us.anthropic.claude-haiku-4-5-20251001-v1:0")
        == "anthropic.claude-haiku-4-5-20251001-v1:0"
    )
    assert base_model("eu.amazon.nova-2-lite-v1:0") == "amazon.nova-2-lite-v1:0"
    assert base_model("global.anthropic.claude-haiku-4-5-20251001-v1:0").startswith("global.")
    assert base_model("amazon.nova-2-lite-v1:0") == "amazon.nova-2-lite-v1:0"


def test_cost_of_a_profile_uses_the_base_models_catalog_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def price(
        model: str, usage: TokenUsage, provider: str | None = None, configured: str | None = None
    ) -> Decimal | None:
        asked.append(model)
        return Decimal("1.5") if model == "amazon.nova-2-lite-v1:0" else None

    monkeypatch.setattr("agentloop.providers.bedrock.provider.price_of", price)

    assert BedrockProvider().cost(MODEL, TokenUsage(input_tokens=10)) == Decimal("1.5")
    assert asked == [MODEL, "amazon.nova-2-lite-v1:0"]


# -- options that follow the model (providers/model_options.py) ---------------------------------
def test_the_body_sends_thinking_and_temperature_through_the_model_options(monkeypatch):
    from agentloop.messages import Thinking
    from agentloop.providers import model_options
    from agentloop.providers.bedrock.mapping import request_body

    claude = "anthropic.claude-sonnet-4-5-20250929-v1:0"
    request = ask(model=claude, thinking=Thinking(effort="low"), temperature=0.3)

    # Bedrock's ids are not in the catalog: what the chat asked for is sent.
    body = request_body(request, "bedrock")
    assert body["inferenceConfig"]["temperature"] == 0.3
    assert "reasoning_config" in body["additionalModelRequestFields"]

    # A model the catalog listed without them gets neither.
    monkeypatch.setattr(model_options, "accepts", lambda model, option: False)
    body = request_body(request, "bedrock")
    assert "temperature" not in body["inferenceConfig"]
    assert "additionalModelRequestFields" not in body
