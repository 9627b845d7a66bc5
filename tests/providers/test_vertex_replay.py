"""Replaying the recorded Vertex AI traffic (``providers-cloud``, cassettes named
``*vertexai*``: Gemini 2.5 Flash, Gemini 3 Flash preview, Gemini 3.1 Pro preview).

Each recording starts with the OAuth refresh-token exchange (``oauth2.googleapis.com/token``).
The provider is given authorized-user credentials holding the recording's placeholders, so
google-auth really refreshes the token through the same MockTransport, and the bearer token
the API calls carry is the one the recorded exchange answered. Test ids are cassette names:
- the token exchange: the form our credentials post equals the recorded one;
- the request: each recorded body is read back into our ModelRequest (``gemini_wire``'s
  reverse mapper, shared with the Gemini API replay), the body we build must equal the
  recorded one, and it must go to the recorded URL (the project and location placeholders
  filled in: the host without a region is the ``global`` location's) with the token;
- the response: each recorded answer (JSON or SSE) must parse into the recorded text, calls
  (ids and thought signatures), thinking and usage, or raise the right ProviderError;
- the round trip: in multi-turn cassettes, the parsed answer put back into the conversation
  gives the model turn of the next recorded request (less the differences below);
- counting tokens: the recorded ``:countTokens`` call and its answer.
The four ``streaming error chunks/events`` cassettes hold only the token exchange (RubyLLM
stubbed the failing stream in process): the exchange is replayed, and the stream that follows
is Google's mid-stream error envelope, written here.

Deliberate differences (applied by ``gemini_wire.expected_body`` and below):
1. RubyLLM always sends ``"generationConfig": {}``; we leave an empty config out.
2. With parallel calls Gemini signs only the first ``functionCall`` part; RubyLLM copies that
   signature onto every call it sends back. We send each part back as it came.
3. Thought-summary parts (``"thought": true``) go back as they came, with the signature on
   the part it came on: RubyLLM dropped them (Gemini 3.1 Pro) or moved the answer text's
   signature onto them (Gemini 3 Flash).
4. Gemini 3 gives calls ids (``call_3257537``); we send the id back on the call (and on its
   ``functionResponse``), as Google documents; RubyLLM sent none.
5. One cassette refreshes the token twice (RubyLLM made a new client per chat); a provider
   here reuses a token while it is valid, so the second exchange is not asked for.
Everything else must be equal.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import httpx
import pytest

from agentloop.exceptions import ContextLengthError, ProviderError, RateLimitError, ServerError
from agentloop.messages import ModelRequest, ModelResponse, Thinking
from agentloop.providers.gemini import CALL_ID, PARTS_KEY, SIGNATURE
from agentloop.providers.thinking import REPLAY_PROVIDER
from tests.providers import cassettes, gemini_wire
from tests.providers.cassettes import CLOUD, Interaction, cached
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
from tests.providers.vertex_wire import (
    ACCESS_TOKEN,
    form,
    is_token_exchange,
    recorded_url,
    serving,
)
from tests.providers.wire import as_message, event_stream

_F = "chat_function_calling_vertexai_gemini-2_5-flash_"
_B = "chat_basic_chat_functionality_vertexai_gemini-2_5-flash_"
_E = "chat_error_handling_with_vertexai_gemini-2_5-flash_faraday_version_"
_T = "chat_with_extended_thinking_vertexai_gemini-3-flash-preview_"
#: every Vertex AI recording (a missing one fails: see test_every_recording_is_here).
ERROR_STREAMS = tuple(
    f"{_E}{v}_vertexai_gemini-2_5-flash_supports_handling_streaming_error_{kind}"
    for v in (1, 2)
    for kind in ("chunks", "events")
)
COUNT = "chat_count_tokens_with_vertexai_gemini-2_5-flash_counts_a_staged_message"
CASSETTES = (
    *(
        _B + n
        for n in (
            "can_handle_multi-turn_conversations",
            "can_have_a_basic_conversation",
            "replaces_previous_system_messages_by_default",
            "returns_raw_responses",
            "successfully_uses_the_system_prompt",
        )
    ),
    *(
        _F + n
        for n in (
            "can_handle_multiple_tool_calls_in_a_single_response",
            "can_use_parallel_tool_calls",
            "can_use_tools",
            "can_use_tools_in_multi-turn_conversations",
            "can_use_tools_with_multi-turn_streaming_conversations",
            "can_use_tools_without_parameters",
            "can_use_tools_without_parameters_in_multi-turn_streaming_conversations",
            "handles_anyof_params",
            "handles_array_params",
            "handles_object_params",
        )
    ),
    "chat_function_calling_thought_signatures_vertexai_gemini-3_1-pro-preview_"
    "includes_thought_signatures_for_tool_calls",
    "chat_real_error_scenarios_vertexai_gemini-2_5-flash_handles_context_length_exceeded_errors",
    "chat_streaming_responses_vertexai_gemini-2_5-flash_"
    "reports_consistent_token_counts_compared_to_non-streaming",
    "chat_streaming_responses_vertexai_gemini-2_5-flash_supports_streaming_responses",
    "chat_string_tool_results_vertexai_gemini-2_5-flash_preserves_strings_returned_from_tools",
    *(
        _T + n
        for n in (
            "preserves_thinking_signatures_between_turns_when_provided",
            "returns_thinking_when_available",
            "streams_thinking_content_when_available",
        )
    ),
)
ALL = (*CASSETTES, COUNT, *ERROR_STREAMS)
#: the error each recorded error answer must raise
ERRORS: dict[int, type[ProviderError]] = {400: ContextLengthError}

# every test here replays the recordings (ROUND_TRIPS below reads them on import): skipped
# without them (failing under CI=true)
cassettes.require_fixtures(CLOUD)


def load(name: str) -> list[Interaction]:
    return cached(name, CLOUD).interactions


def calls_of(name: str) -> list[Interaction]:
    """The API calls of a recording (its token exchanges left out)."""
    return [i for i in load(name) if not is_token_exchange(i)]


def model_of(interaction: Interaction) -> str:
    return interaction.uri.rpartition("/models/")[2].partition(":")[0]


def to_request(interaction: Interaction) -> ModelRequest:
    return gemini_wire.to_request(interaction, model_of(interaction))


def send(provider: Any, interaction: Interaction) -> tuple[ModelResponse | int, list[Any]]:
    """What the provider makes of the recorded call: its answer (or count) and chunks."""
    request = to_request(interaction)
    if interaction.uri.endswith(":countTokens"):
        return provider.count_tokens(request), []
    chunks: list[Any] = []
    return provider.request(request, on_chunk=chunks.append if request.stream else None), chunks


def token_exchange(name: str) -> Interaction:
    return next(i for i in load(name) if is_token_exchange(i))


def replay_response(name: str, interaction: Interaction) -> tuple[Any, list[Any]]:
    """The answer to one recorded call, after the cassette's token exchange."""
    provider, _ = serving([token_exchange(name), interaction])
    return send(provider, interaction)


_pass_counts = cassettes.pass_counts(__name__, "Vertex AI replay", "vertexai")


def test_every_recording_is_here():
    present = set(cassettes.names("vertexai", CLOUD))
    assert set(ALL) - present == set(), "expected Vertex AI recordings are missing"
    assert present == set(ALL), f"recordings no test replays: {sorted(present - set(ALL))}"


# -- 1. the token exchange and the requests ------------------------------------------------
@pytest.mark.parametrize("name", ALL, ids=ALL)
def test_the_token_exchange_posts_the_recorded_refresh_grant(name):
    recorded = token_exchange(name)
    provider, server = serving([recorded])

    provider.auth_headers(None)

    (sent,) = server.token_requests
    assert sent.method == recorded.method == "POST"
    assert form(sent.content.decode()) == form(recorded.request_body)
    assert sent.headers["content-type"] == "application/x-www-form-urlencoded"


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_body_matches_the_recording(name):
    provider, _ = serving([])
    for interaction in calls_of(name):
        request = to_request(interaction)

        built = provider.build_body(request, stream=request.stream)

        assert built == expected_body(interaction.request_body)


@pytest.mark.parametrize("name", (*CASSETTES, COUNT), ids=(*CASSETTES, COUNT))
def test_requests_go_to_the_recorded_urls_with_the_refreshed_token(name):
    provider, server = serving(load(name))
    for interaction in calls_of(name):
        with pytest.raises(ProviderError) if interaction.status >= 400 else nullcontext():
            send(provider, interaction)

    assert len(server.token_requests) == 1  # difference 5: one token while it is valid
    assert server.sent[0] is server.token_requests[0]
    recorded = calls_of(name)
    for sent, interaction in zip(server.api_requests, recorded, strict=True):
        assert str(sent.url) == recorded_url(interaction)
        assert sent.headers["authorization"] == f"Bearer {ACCESS_TOKEN}"
        assert "x-goog-api-key" not in sent.headers
        assert "key=" not in str(sent.url)
    assert server.api_bodies() == [expected_body(i.request_body) for i in recorded]


# -- 2. the response ------------------------------------------------------------------------
def thinking_of(interaction: Interaction) -> str:
    thoughts = [p["text"] for p in recorded_parts(interaction) if p.get("thought")]
    if not interaction.is_stream:
        return "\n\n".join(thoughts)
    return "".join(thoughts)  # streamed thought pieces are one thought


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_recorded_response_parses(name):
    for interaction in calls_of(name):
        if interaction.status >= 400:
            with pytest.raises(ERRORS[interaction.status]) as raised:
                replay_response(name, interaction)
            assert raised.value.status == interaction.status
            assert ACCESS_TOKEN not in str(raised.value) + repr(raised.value)
            assert "exceeds the maximum number of tokens" in str(raised.value)
            continue

        response, chunks = replay_response(name, interaction)

        assert response.content == recorded_text(interaction)
        calls = [(c.name, c.arguments, c.provider_data.get(SIGNATURE)) for c in response.tool_calls]
        assert calls == recorded_calls(interaction)
        parts = recorded_parts(interaction)
        ids = [p["functionCall"].get("id") for p in parts if "functionCall" in p]
        for call, vendor_id in zip(response.tool_calls, ids, strict=True):
            assert call.id == vendor_id if vendor_id else call.id.startswith("call_")
            assert call.provider_data.get(CALL_ID) == vendor_id
        usage = recorded_usage(interaction)
        thoughts = usage.get("thoughtsTokenCount", 0)
        assert response.usage.input_tokens == usage["promptTokenCount"]
        assert response.usage.output_tokens == usage["candidatesTokenCount"] + thoughts
        assert response.usage.reasoning_tokens == thoughts
        assert response.usage.cached_tokens == usage.get("cachedContentTokenCount", 0)
        assert usage["promptTokenCount"] + response.usage.output_tokens == usage["totalTokenCount"]
        assert response.model == model_of(interaction)
        assert response.finish_reason == ("tool_calls" if response.tool_calls else "stop")
        assert response.provider_data["finish_reason"] == "STOP"
        assert response.thinking == thinking_of(interaction)
        signed_text = [p for p in recorded_parts(interaction) if "text" in p and len(p) > 1]
        if signed_text:  # thought parts and signed text go back as they came
            kept = [p for p in response.provider_data[PARTS_KEY] if "text" in p]
            signatures = [p.get("thoughtSignature") for p in signed_text if "thoughtSignature" in p]
            assert [p["thoughtSignature"] for p in kept if "thoughtSignature" in p] == signatures
            assert response.provider_data[REPLAY_PROVIDER] == "vertexai"
        else:
            assert PARTS_KEY not in response.provider_data
        if interaction.is_stream:
            assert_chunks_match(interaction, chunks, response)


def test_the_thinking_cassettes_ask_for_thinking_levels():
    """The reverse mapper reads Gemini 3's thinking level (the request test compares bodies)."""
    for name in CASSETTES:
        for interaction in calls_of(name):
            if "gemini-3" in interaction.uri:
                assert to_request(interaction).thinking in (
                    Thinking(effort="low"),
                    Thinking(effort="medium"),
                )


# -- 3. the round trip ------------------------------------------------------------------------
ROUND_TRIPS = [name for name in CASSETTES if follow_ups(calls_of(name))]


def expected_turn(sent: dict[str, Any], answer: Interaction) -> dict[str, Any]:
    """The next recorded model turn with differences 2 to 4 applied: an answer with thought
    parts or call ids goes back exactly as it came."""
    received = recorded_parts(answer)
    if any(p.get("thought") or p.get("functionCall", {}).get("id") for p in received):
        return {"role": "model", "parts": copy.deepcopy(received)}
    return expected_model_turn(sent, answer)


@pytest.mark.parametrize("name", ROUND_TRIPS, ids=ROUND_TRIPS)
def test_parsed_answer_becomes_the_next_recorded_model_turn(name):
    interactions = calls_of(name)
    provider, _ = serving([])
    for k in follow_ups(interactions):
        response, _ = replay_response(name, interactions[k])
        earlier = to_request(interactions[k])
        request = earlier.model_copy(update={"messages": [*earlier.messages, as_message(response)]})

        body = provider.build_body(request, stream=False)

        sent = interactions[k + 1].request_body["contents"]
        position = len(interactions[k].request_body["contents"])
        assert body["contents"][:position] == sent[:position]
        assert body["contents"][position:] == [expected_turn(sent[position], interactions[k])]


def test_the_thought_part_differences_are_the_only_ones():
    """Differences 3 and 4, exactly: what RubyLLM sent is the answer as received less the
    thought part and the call id (3.1 Pro), or with the signature moved (3 Flash)."""
    pro = calls_of(
        "chat_function_calling_thought_signatures_vertexai_gemini-3_1-pro-preview_"
        "includes_thought_signatures_for_tool_calls"
    )
    received = copy.deepcopy(recorded_parts(pro[0]))
    del received[1]["functionCall"]["id"]
    assert pro[1].request_body["contents"][1]["parts"] == received[1:]

    flash = calls_of(_T + "preserves_thinking_signatures_between_turns_when_provided")
    thought, text = copy.deepcopy(recorded_parts(flash[0]))
    thought["thoughtSignature"] = text.pop("thoughtSignature")
    assert flash[1].request_body["contents"][1]["parts"] == [thought, text]


# -- 4. counting tokens -----------------------------------------------------------------------
def test_count_tokens_replays():
    (interaction,) = calls_of(COUNT)
    provider, server = serving(load(COUNT))

    counted, _ = send(provider, interaction)

    assert counted == interaction.response_json()["totalTokens"] == 7
    assert server.api_bodies() == [interaction.request_body]
    assert str(server.api_requests[0].url) == recorded_url(interaction)


# -- 5. errors in a stream, after the recorded token exchange ------------------------------------
def _error_event(kind: str, code: int, status: str) -> str:
    envelope = f'{{"error": {{"code": {code}, "message": "Try later", "status": "{status}"}}}}'
    text = 'data: {"candidates": [{"content": {"role": "model", "parts": [{"text": "1, "}]}}]}\n\n'
    if kind == "events":
        return text + f"event: error\ndata: {envelope}\n\n"
    return text + f"data: {envelope}\n\n"


STREAM_ERRORS = [(429, "RESOURCE_EXHAUSTED", RateLimitError), (503, "UNAVAILABLE", ServerError)]


@pytest.mark.parametrize("name", ERROR_STREAMS, ids=ERROR_STREAMS)
def test_an_error_in_the_stream_raises_its_kind(name):
    kind = name.rpartition("_")[2]
    streams = [event_stream(_error_event(kind, code, status)) for code, status, _ in STREAM_ERRORS]
    provider, server = serving(load(name), *streams)
    request = ModelRequest(model="gemini-2.5-flash", messages=[], stream=True)
    for code, status, error in STREAM_ERRORS:
        chunks: list[Any] = []

        with pytest.raises(error) as raised:
            provider.request(request, on_chunk=chunks.append)

        assert raised.value.status == code
        assert status in str(raised.value)
        assert [c.text for c in chunks] == ["1, "]
    assert len(server.token_requests) == 1
    assert all(r.headers["authorization"] == f"Bearer {ACCESS_TOKEN}" for r in server.api_requests)


def test_a_recorded_error_status_with_a_json_array_body():
    """Vertex answers a failed stream request with a JSON array of one error envelope."""
    token = token_exchange(ERROR_STREAMS[0])
    body = '[{"error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}}]'
    provider, _ = serving([token], httpx.Response(429, text=body))
    request = ModelRequest(model="gemini-2.5-flash", messages=[], stream=True)

    with pytest.raises(RateLimitError):
        provider.request(request, on_chunk=lambda chunk: None)
