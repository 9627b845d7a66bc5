"""Replays every recorded Azure AI Foundry interaction (``*azure*`` in
../shared/fixtures/providers-cloud/, read in place) through :class:`AzureProvider`.

For every interaction of every cassette (test ids are the cassette names):

1. the route: the provider sends the model to the route the recording went to (the URL's
   path and ``api-version`` query), chosen by the rule, except in the
   ``responses_protocol_dialects`` cassettes, whose test asked for Responses explicitly (as
   ``ROUTE_ASKED`` does here);
2. the request: the recorded body, read back into our ModelRequest by the OpenAI replay
   modules' reverse mappers, becomes the same body again, sent with the ``api-key`` header
   to the recorded URL;
3. the answer: the recorded response (JSON or SSE) parses into the recorded text, tool calls,
   usage and kept reasoning items, or raises the right ProviderError;
4. the round trip (Responses): the parsed answer, put back into the conversation, gives
   exactly the ``input`` of the next recorded request (reasoning items included).

Deliberate request differences, all in tool definitions: RubyLLM writes its own
``"strict": true`` inside the parameter schema (no JSON Schema keyword; we never send it);
on Responses, RubyLLM sends ``"strict": false`` for every tool and we send ``true`` when the
schema already fits strict mode. Chat Completions tools go without ``function.strict``, as
recorded. Everything else must be equal.

The context-length cassette recorded a 429 (the request was over the deployment's tokens
per minute before it was over the context window): it replays as the RateLimitError it is.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from agentloop import providers
from agentloop.exceptions import AuthenticationError, ProviderError, RateLimitError
from agentloop.messages import ModelRequest, TextDelta, Thinking, ToolCallDelta
from agentloop.models import Chat, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.azure import AzureProvider
from agentloop.providers.openai_responses import OUTPUT_KEY
from tests.providers import cassettes
from tests.providers import openai_chat_wire as chat_wire
from tests.providers import openai_responses_wire as responses_wire
from tests.providers.cassettes import Cassette, Interaction
from tests.providers.wire import as_message

CLOUD = cassettes.CLOUD
ENDPOINT = "https://rubyllm.services.ai.azure.com"
KEY = "test-key"
GROK = "chat_{}_azure_grok-4-1-fast-non-reasoning_{}"
NANO = "chat_{}_azure_gpt-5-nano_{}"
#: every Azure recording this module replays; a missing one fails, a new one is noticed.
EXPECTED = sorted(
    [
        *(
            GROK.format("basic_chat_functionality", case)
            for case in (
                "can_handle_multi-turn_conversations",
                "can_have_a_basic_conversation",
                "replaces_previous_system_messages_by_default",
                "returns_raw_responses",
                "successfully_uses_the_system_prompt",
            )
        ),
        *(
            GROK.format("function_calling", case)
            for case in (
                "can_handle_multiple_tool_calls_in_a_single_response",
                "can_use_parallel_tool_calls",
                "can_use_tools",
                "can_use_tools_in_multi-turn_conversations",
                "can_use_tools_without_parameters",
                "can_use_tools_without_parameters_in_multi-turn_streaming_conversations",
                "handles_anyof_params",
                "handles_array_params",
                "handles_object_params",
            )
        ),
        GROK.format("error_handling_with", "raises_appropriate_auth_error"),
        GROK.format("real_error_scenarios", "handles_context_length_exceeded_errors"),
        GROK.format("streaming_responses", "supports_streaming_responses"),
        GROK.format("string_tool_results", "preserves_strings_returned_from_tools"),
        *(
            NANO.format("responses_protocol_dialects_with", case)
            for case in (
                "chats_on_the_openai_v1_responses_endpoint",
                "round-trips_tool_calls",
                "streams_responses",
            )
        ),
        *(
            NANO.format("with_extended_thinking", case)
            for case in (
                "preserves_thinking_signatures_between_turns_when_provided",
                "returns_thinking_when_available",
                "streams_thinking_content_when_available",
            )
        ),
        "chat_change_model_on_the_fly_between_anthropic_claude-haiku-4-5_and_azure_"
        "grok-4-1-fast-non-reasoning",
        "providers_azure_responses_a_gpt-5_6_deployment_calls_tools_which_this_model_"
        "generation_rejects_on_chat_completions",
        "providers_azure_responses_a_gpt-5_6_deployment_routes_to_responses_without_being_asked",
    ]
)
#: cassettes whose recording test asked for a route instead of leaving it to the rule.
ROUTE_ASKED = {"responses_protocol_dialects": "responses"}
#: the route each recorded URL path means.
PATHS = {"/models/chat/completions": "chat", "/openai/v1/responses": "responses"}

_pass_counts = cassettes.pass_counts(__name__, "Azure AI Foundry replay (providers-cloud)", "azure")


@cache
def recording(name: str) -> Cassette:
    """The cassette, read once (tests serve copies of its interactions)."""
    cassettes.require_fixtures(CLOUD)
    if not (CLOUD / f"{name}.yml").is_file():
        pytest.fail(f"the expected Azure recording {name}.yml is missing from {CLOUD}")
    return cassettes.load(name, CLOUD)


def azure(name: str) -> list[Interaction]:
    """The cassette's Azure interactions (the change-model one starts with Anthropic's)."""
    return [i for i in recording(name).interactions if i.uri.startswith(ENDPOINT)]


def provider_for(name: str, *interactions: Interaction) -> tuple[AzureProvider, Cassette]:
    route = next((route for part, route in ROUTE_ASKED.items() if part in name), None)
    served = Cassette(name, list(interactions))
    provider = AzureProvider(
        api_key=KEY, endpoint=ENDPOINT, route=route, transport=served.transport()
    )
    return provider, served


def recorded_route(interaction: Interaction) -> str:
    path, _, query = interaction.uri.removeprefix(ENDPOINT).partition("?")
    route = PATHS[path]
    assert query == ("api-version=2024-05-01-preview" if route == "chat" else "")
    return route


def to_request(interaction: Interaction) -> ModelRequest:
    """Our ModelRequest for a recorded body, read by the OpenAI replay modules' mappers."""
    body = interaction.request_body
    if recorded_route(interaction) == "responses":
        return responses_wire.to_request(body)
    gaps: list[str] = []
    request = chat_wire.to_request(body, gaps)
    assert gaps == []
    options = dict(request.provider_options)
    effort = options.pop("reasoning_effort", None)  # with_thinking's field on this route
    assert options == {}, f"fields the reverse mapper left over: {options}"
    thinking = Thinking(effort=effort) if effort else None
    return request.model_copy(update={"provider_options": {}, "thinking": thinking})


# -- the tests -------------------------------------------------------------------------------
def test_every_azure_recording_is_replayed():
    cassettes.require_fixtures(CLOUD)
    assert cassettes.names("azure", CLOUD) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED, ids=EXPECTED)
def test_the_model_goes_to_the_recorded_route(name):
    interactions = azure(name)
    provider, _ = provider_for(name)
    assert interactions
    for interaction in interactions:
        assert provider.route(interaction.request_body["model"]) == recorded_route(interaction)


def assert_body_matches(interaction: Interaction, provider: AzureProvider, ours: dict) -> None:
    recorded = interaction.request_body
    if recorded_route(interaction) == "chat":
        assert chat_wire.comparable_ours(ours, provider.chat) == chat_wire.comparable_recorded(
            recorded
        )
        return
    ours = dict(ours)
    for built, tool in zip(ours.pop("tools", []), recorded.get("tools", []), strict=True):
        parameters = responses_wire.recorded_parameters(tool)
        assert (built["name"], built["description"]) == (tool["name"], tool["description"])
        assert built["parameters"] == parameters
        assert built["strict"] is responses_wire.expected_strict(parameters)
    assert ours == {key: value for key, value in recorded.items() if key != "tools"}


@pytest.mark.parametrize("name", EXPECTED, ids=EXPECTED)
def test_our_request_is_the_recorded_one_at_the_recorded_url(name):
    for number, interaction in enumerate(azure(name)):
        provider, served = provider_for(name, interaction)
        request = to_request(interaction)
        family = provider.family(request.model)
        ours = family.build_body(request, request.stream)

        assert_body_matches(interaction, provider, ours)
        try:
            provider.request(request, on_chunk=(lambda chunk: None) if request.stream else None)
        except ProviderError:
            assert interaction.status >= 400
        (sent,) = served.sent
        assert str(sent.url) == interaction.uri, number
        assert sent.headers["api-key"] == KEY
        assert "authorization" not in sent.headers
        assert json.loads(sent.content) == ours


@pytest.mark.parametrize("name", EXPECTED, ids=EXPECTED)
def test_the_recorded_answer_parses(name):
    for interaction in azure(name):
        provider, _ = provider_for(name, interaction)
        request = to_request(interaction)
        chunks: list[Any] = []
        on_chunk = chunks.append if request.stream else None
        if interaction.status >= 400:
            assert_error(interaction, provider, request)
            continue
        response = provider.request(request, on_chunk=on_chunk)
        if recorded_route(interaction) == "chat":
            expected = chat_wire.recorded_answer(interaction)
            assert response.content == expected["text"]
            assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == expected["calls"]
            assert response.usage == chat_wire.expected_usage(expected["usage"])
            if request.stream:
                streamed = "".join(c.text for c in chunks if isinstance(c, TextDelta))
                assert streamed == expected["text"]
                ids = [c.id for c in chunks if isinstance(c, ToolCallDelta) and c.id]
                assert ids == [call_id for call_id, _, _ in expected["calls"]]
            continue
        answer = responses_wire.recorded_answer(interaction)
        assert response.content == responses_wire.recorded_text(answer)
        calls = [(c.id, c.name, c.arguments) for c in response.tool_calls]
        assert calls == responses_wire.recorded_calls(answer)
        usage = answer["usage"]
        assert (response.usage.input_tokens, response.usage.output_tokens) == (
            usage["input_tokens"],
            usage["output_tokens"],
        )
        assert response.usage.cache_read_tokens == usage["input_tokens_details"]["cached_tokens"]
        reasoning = usage["output_tokens_details"]["reasoning_tokens"]
        assert response.usage.reasoning_tokens == reasoning
        kept = response.provider_data.get(OUTPUT_KEY, [])
        assert [item["type"] for item in kept] == [item["type"] for item in answer["output"]]
        encrypted = [i for i in answer["output"] if i["type"] == "reasoning"]
        assert len([item for item in kept if item.get("encrypted_content")]) == len(encrypted)
        if encrypted:
            assert response.provider_data["replay_provider"] == "azure"
        if interaction.is_stream:
            responses_wire.assert_chunks_match(interaction, chunks, response)


def assert_error(interaction: Interaction, provider: AzureProvider, request: ModelRequest):
    expected = {401: AuthenticationError, 429: RateLimitError}[interaction.status]
    with pytest.raises(expected) as raised:
        provider.request(request)
    error = raised.value
    assert error.status == interaction.status
    assert KEY not in str(error) + repr(error) + (error.body or "")
    if expected is RateLimitError:
        # Azure says both Retry-After: 1 and Retry-After-Ms: 0; the finer one is read.
        assert error.retry_after == 0.0


#: the Responses cassettes of more than one turn.
ROUND_TRIPS = [
    NANO.format("responses_protocol_dialects_with", "chats_on_the_openai_v1_responses_endpoint"),
    NANO.format("responses_protocol_dialects_with", "round-trips_tool_calls"),
    "providers_azure_responses_a_gpt-5_6_deployment_calls_tools_which_this_model_"
    "generation_rejects_on_chat_completions",
]


@pytest.mark.parametrize("name", ROUND_TRIPS, ids=ROUND_TRIPS)
def test_the_parsed_answer_becomes_the_next_recorded_input(name):
    interactions = azure(name)
    follow_ups = cassettes.continued(interactions, "input")
    assert follow_ups
    for k in follow_ups:
        provider, _ = provider_for(name, interactions[k])
        response = provider.request(to_request(interactions[k]))
        before, after = interactions[k].request_body, interactions[k + 1].request_body
        request = responses_wire.with_parsed_answer(before, after, as_message(response))

        body = provider.responses.build_body(request, after["stream"])

        assert body["input"] == after["input"], f"interaction {k + 1}"


# -- a persisted chat, end to end ------------------------------------------------------------
(CHANGE_MODEL,) = (name for name in EXPECTED if name.startswith("chat_change_model_on_the_fly"))


@pytest.mark.django_db
def test_a_chat_switching_from_claude_to_azure_sends_the_recorded_azure_request(user):
    served = Cassette(CHANGE_MODEL, list(recording(CHANGE_MODEL).interactions))
    transport = served.transport()
    providers.register("anthropic", AnthropicProvider(api_key=KEY, transport=transport))
    providers.register("azure", AzureProvider(api_key=KEY, endpoint=ENDPOINT, transport=transport))
    try:
        chat = Chat.objects.create(model="anthropic:claude-haiku-4-5", owner=user)
        chat.with_temperature(0.0)
        first = chat.ask("Reply with exactly: FOUR")
        Chat.objects.get(pk=chat.pk).with_model("azure:grok-4-1-fast-non-reasoning")
        second = Chat.objects.get(pk=chat.pk).ask("Reply with exactly: EIGHT")
    finally:
        providers.unregister("anthropic")
        providers.unregister("azure")

    recorded = azure(CHANGE_MODEL)[0]
    assert (first.content, second.content) == ("FOUR", "EIGHT")
    assert str(served.sent[1].url) == recorded.uri
    assert served.sent[1].headers["api-key"] == KEY
    assert json.loads(served.sent[1].content) == recorded.request_body
    usage = list(Usage.objects.filter(chat=chat).order_by("id").values_list("provider", "model"))
    assert usage == [
        ("anthropic", "claude-haiku-4-5"),
        ("azure", "grok-4-1-fast-non-reasoning"),
    ]
