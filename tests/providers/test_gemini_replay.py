"""Replaying the recorded Gemini traffic (cassettes named ``*gemini_gemini-2_5-flash*``).

For every cassette but the batch one (test ids are the cassette names):
- the request: each recorded body is read back into our ModelRequest by a small reverse
  mapper of the wire format (contents, system instruction, function declarations in
  Gemini's schema dialect, tool config, generation config), the body our provider builds
  for it must equal the recorded one, and it must go to the recorded URL with the key in
  the ``x-goog-api-key`` header;
- the response: each recorded answer (JSON or SSE) goes through ``provider.request`` and
  must parse into the recorded text, function calls (with their thought signatures) and
  usage, or raise the right ProviderError;
- the round trip: in multi-turn cassettes, the answer we parsed, put back into the
  conversation, must give the model turn that the next recorded request sent.

Deliberate request differences (applied by ``expected_body`` / ``expected_model_turn``):
1. RubyLLM always sends ``"generationConfig": {}``; we leave an empty config out.
2. RubyLLM writes the function-calling mode in lower case (``"none"``, ``"any"``); we send
   the spelling the API reference documents (``"NONE"``, ``"ANY"``). The API read both.
3. With parallel calls Gemini signs only the first ``functionCall`` part; RubyLLM keeps one
   signature per message and copies it onto every call it sends back. We send each part
   back as it came (the signature on the first call only), as Google's thought-signature
   guide asks. This only shows in the round trip.
Everything else must be equal.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest

from agentloop.exceptions import AuthenticationError, ProviderError, RateLimitError
from agentloop.messages import ModelRequest, ModelResponse
from agentloop.providers.gemini import CALL_ID, PARTS_KEY, SIGNATURE, GeminiProvider
from tests.providers import cassettes, gemini_wire
from tests.providers.cassettes import Interaction, cached, names, require_fixtures
from tests.providers.gemini_wire import (
    assert_chunks_match,
    expected_body,
    expected_model_turn,
    follow_ups,
    recorded_calls,
    recorded_parts,
    recorded_text,
    recorded_usage,
)
from tests.providers.wire import as_message

# every test here replays the recordings: skipped without them (failing under CI=true)
require_fixtures()
CASSETTES = [name for name in names("gemini_gemini-2_5-flash") if not name.startswith("batch_")]
BASE = "https://generativelanguage.googleapis.com/v1beta/models/"
#: the error each recorded error answer must raise
ERRORS: dict[int, type[ProviderError]] = {400: AuthenticationError, 429: RateLimitError}


def model_of(interaction: Interaction) -> str:
    assert interaction.uri.startswith(BASE), interaction.uri
    return interaction.uri[len(BASE) :].partition(":")[0]


def to_request(interaction: Interaction) -> ModelRequest:
    """The recorded body read back (``gemini_wire``'s reverse mapper) for its model."""
    return gemini_wire.to_request(interaction, model_of(interaction))


# "gemini: N of M cassettes pass": every test of a cassette (request, URL, response, round
# trip) passed.
_pass_counts = cassettes.pass_counts(__name__, "Gemini replay", "gemini")


def test_recorded_traffic_is_present():
    assert len(CASSETTES) >= 20, CASSETTES


# -- 1. the request -------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_body_matches_the_recording(name):
    provider = GeminiProvider(api_key="test-key")
    for interaction in cached(name).interactions:
        request = to_request(interaction)

        built = provider.build_body(request, stream=request.stream)

        assert built == expected_body(interaction.request_body)


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_goes_to_the_recorded_url_with_the_key_header(name):
    interactions = cached(name).interactions
    provider, replay = cassettes.serve(GeminiProvider, *interactions)
    for interaction in interactions:
        request = to_request(interaction)
        on_chunk = (lambda chunk: None) if request.stream else None
        with pytest.raises(ProviderError) if interaction.status >= 400 else nullcontext():
            provider.request(request, on_chunk=on_chunk)

    for sent, interaction in zip(replay.sent, interactions, strict=True):
        assert str(sent.url) == interaction.uri
        assert sent.headers["x-goog-api-key"] == "test-key"
        assert "key=" not in str(sent.url)
        assert "authorization" not in sent.headers
    assert replay.sent_bodies() == [expected_body(i.request_body) for i in interactions]


# -- 2. the response ------------------------------------------------------------------------
def replay_response(interaction: Interaction) -> tuple[ModelResponse, list[Any]]:
    return cassettes.replay(GeminiProvider, interaction, to_request(interaction))


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_recorded_response_parses(name):
    for interaction in cached(name).interactions:
        if interaction.status >= 400:
            with pytest.raises(ERRORS[interaction.status]) as raised:
                replay_response(interaction)
            assert raised.value.status == interaction.status
            assert "test-key" not in str(raised.value) + repr(raised.value)
            assert "test-key" not in (raised.value.body or "")
            if interaction.status == 429:  # RetryInfo {"retryDelay": "48s"}, no header
                assert raised.value.retry_after == 48.0
            continue

        response, chunks = replay_response(interaction)

        assert response.content == recorded_text(interaction)
        calls = [
            (call.name, call.arguments, call.provider_data.get(SIGNATURE))
            for call in response.tool_calls
        ]
        assert calls == recorded_calls(interaction)
        assert all(call.id.startswith("call_") for call in response.tool_calls)
        assert len({call.id for call in response.tool_calls}) == len(response.tool_calls)
        assert all(CALL_ID not in call.provider_data for call in response.tool_calls)
        usage = recorded_usage(interaction)
        thoughts = usage.get("thoughtsTokenCount", 0)
        assert response.usage.input_tokens == usage["promptTokenCount"]
        assert response.usage.output_tokens == usage["candidatesTokenCount"] + thoughts
        assert response.usage.reasoning_tokens == thoughts
        assert response.usage.cached_tokens == usage.get("cachedContentTokenCount", 0)
        assert (
            usage["promptTokenCount"] + usage["candidatesTokenCount"] + thoughts
            == usage["totalTokenCount"]
        )
        assert response.model == "gemini-2.5-flash"
        assert response.finish_reason == ("tool_calls" if response.tool_calls else "stop")
        assert response.provider_data["finish_reason"] == "STOP"
        assert response.parsed is None  # no Gemini cassette asks for structured output
        signed_text = [p for p in recorded_parts(interaction) if "text" in p and len(p) > 1]
        if signed_text:
            kept = response.provider_data[PARTS_KEY]
            assert [p.get("thoughtSignature") for p in kept if "text" in p] == [
                p.get("thoughtSignature") for p in signed_text
            ]
        else:
            assert PARTS_KEY not in response.provider_data
        if interaction.is_stream:
            assert_chunks_match(interaction, chunks, response)


# -- 3. the round trip: a parsed answer -> the next recorded request -----------------------------
ROUND_TRIPS = [name for name in CASSETTES if follow_ups(cached(name).interactions)]


@pytest.mark.parametrize("name", ROUND_TRIPS, ids=ROUND_TRIPS)
def test_parsed_answer_becomes_the_next_recorded_model_turn(name):
    interactions = cached(name).interactions
    for k in follow_ups(interactions):
        response, _ = replay_response(interactions[k])
        earlier = to_request(interactions[k])
        request = earlier.model_copy(update={"messages": [*earlier.messages, as_message(response)]})

        body = GeminiProvider(api_key="test-key").build_body(request, stream=False)

        sent = interactions[k + 1].request_body["contents"]
        position = len(interactions[k].request_body["contents"])
        assert body["contents"][:position] == sent[:position]
        assert body["contents"][position:] == [
            expected_model_turn(sent[position], interactions[k])
        ], f"interaction {k + 1}"


def test_a_copied_signature_is_the_only_round_trip_difference():
    """Difference 3 is real in exactly one cassette, and only on the second call."""
    name = "chat_function_calling_gemini_gemini-2_5-flash_can_use_parallel_tool_calls"
    first, second = cached(name).interactions[:2]
    received = [p for p in recorded_parts(first) if "functionCall" in p]
    sent = [p for p in second.request_body["contents"][1]["parts"] if "functionCall" in p]

    assert [("thoughtSignature" in p) for p in received] == [True, False]
    assert sent[1]["thoughtSignature"] == received[0]["thoughtSignature"]
