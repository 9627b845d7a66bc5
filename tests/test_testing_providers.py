"""The shipped test doubles (ScriptedProvider, FunctionProvider, block_network) and the
provider registry."""

from __future__ import annotations

import os
import socket

import pytest

import agentloop
from agentloop import ConfigurationError, providers, tool
from agentloop.exceptions import RateLimitError, StreamInterruptedError, UnknownProviderError
from agentloop.messages import Message, ModelRequest, TextDelta, TokenUsage, ToolCallDelta
from agentloop.providers import Provider
from agentloop.testing import (
    FunctionProvider,
    NetworkBlockedError,
    OfflineProvider,
    ScriptedProvider,
    block_network,
    reply,
    stream,
    tool_call,
)


def request(text: str = "hi", **fields) -> ModelRequest:
    return ModelRequest(model="test", messages=[Message(role="user", content=text)], **fields)


# -- ScriptedProvider -------------------------------------------------------------------------
def test_scripted_provider_answers_first_in_first_out():
    provider = ScriptedProvider("one", "two")
    assert provider.request(request()).content == "one"
    assert provider.request(request()).content == "two"


def test_scripted_provider_add_queues_more_replies_after_the_first_ones():
    provider = ScriptedProvider("one").add("two", "three")
    assert [provider.request(request()).content for _ in range(3)] == ["one", "two", "three"]


def test_scripted_provider_records_every_request():
    provider = ScriptedProvider("a", "b")
    first, second = request("first"), request("second")
    provider.request(first)
    provider.request(second)
    assert provider.requests == [first, second]


def test_scripted_provider_counts_remaining_replies():
    provider = ScriptedProvider("a", "b")
    provider.request(request())
    assert provider.remaining == 1


def test_assert_complete_fails_while_replies_are_left():
    provider = ScriptedProvider("used", "left over", "also left")
    provider.request(request())
    with pytest.raises(AssertionError, match="2 scripted replies were not used"):
        provider.assert_complete()


def test_assert_complete_passes_when_every_reply_was_used():
    provider = ScriptedProvider("only")
    provider.request(request())
    provider.assert_complete()


def test_scripted_provider_raises_when_out_of_replies():
    provider = ScriptedProvider("only")
    provider.request(request())
    with pytest.raises(AssertionError, match="request #2 but has no replies left"):
        provider.request(request())
    assert len(provider.requests) == 2


def test_a_scripted_exception_is_raised():
    error = RateLimitError("slow down", status=429, retry_after=3)
    provider = ScriptedProvider(error, "after")
    with pytest.raises(RateLimitError) as raised:
        provider.request(request())
    assert raised.value is error
    assert provider.request(request()).content == "after"


def test_a_scripted_tool_call_becomes_an_answer_asking_for_it():
    call = tool_call("add", {"a": 1, "b": 2}, id="c1")
    response = ScriptedProvider(call).request(request())
    assert response.tool_calls == [call]
    assert (response.content, response.finish_reason) == ("", "tool_calls")


def test_a_scripted_list_of_tool_calls_asks_for_all_of_them():
    calls = [tool_call("add", {"a": 1, "b": 2}), tool_call("weather", {"city": "Rome"})]
    response = ScriptedProvider(calls).request(request())
    assert [call.name for call in response.tool_calls] == ["add", "weather"]


def test_tool_call_makes_up_distinct_ids():
    assert tool_call("add").id != tool_call("add").id


def test_reply_builds_text_tool_calls_usage_and_finish_reason():
    usage = TokenUsage(input_tokens=5, output_tokens=7)
    response = reply("Checking.", tool_call("add", id="c1"), usage=usage)
    assert response.content == "Checking."
    assert [call.id for call in response.tool_calls] == ["c1"]
    assert response.usage == usage
    assert response.finish_reason == "tool_calls"
    assert reply("done").finish_reason == "stop"


def test_a_scripted_model_response_is_returned_as_is():
    response = reply("structured", parsed={"a": 1}, finish_reason="length")
    assert ScriptedProvider(response).request(request()) is response


def test_a_text_reply_is_one_chunk_when_streaming():
    chunks = []
    response = ScriptedProvider("all at once").request(request(), on_chunk=chunks.append)
    assert chunks == [TextDelta(text="all at once")]
    assert response.content == "all at once"


def test_a_stream_sends_its_chunks_to_on_chunk():
    chunks = []
    response = ScriptedProvider(stream("Hel", "lo", "!")).request(request(), on_chunk=chunks.append)
    assert chunks == [TextDelta(text="Hel"), TextDelta(text="lo"), TextDelta(text="!")]
    assert response.content == "Hello!"
    assert response.usage.output_tokens == 3


def test_a_stream_is_joined_into_one_answer_without_on_chunk():
    response = ScriptedProvider(stream("Hel", "lo", "!")).request(request())
    assert response.content == "Hello!"
    assert response.finish_reason == "stop"


def test_a_stream_with_tool_calls_sends_tool_call_deltas():
    call = tool_call("add", {"a": 1, "b": 2}, id="c1")
    chunks = []
    response = ScriptedProvider(stream("Adding.", tool_calls=[call])).request(
        request(), on_chunk=chunks.append
    )
    assert chunks == [
        TextDelta(text="Adding."),
        ToolCallDelta(index=0, id="c1", name="add"),
        ToolCallDelta(index=0, arguments='{"a": 1, "b": 2}'),
    ]
    assert response.tool_calls == [call]
    assert response.finish_reason == "tool_calls"


def test_a_stream_with_fail_after_raises_after_that_many_chunks():
    chunks = []
    provider = ScriptedProvider(stream("a", "b", "c", fail_after=2))
    with pytest.raises(RuntimeError, match="stream dropped"):
        provider.request(request(), on_chunk=chunks.append)
    assert [chunk.text for chunk in chunks] == ["a", "b"]


def test_a_stream_with_fail_after_raises_the_given_error():
    dropped = StreamInterruptedError("connection reset")
    provider = ScriptedProvider(stream("a", "b", fail_after=1, error=dropped))
    with pytest.raises(StreamInterruptedError, match="connection reset"):
        provider.request(request())


def test_a_stream_can_fail_after_its_last_chunk():
    chunks = []
    provider = ScriptedProvider(stream("a", "b", fail_after=2))
    with pytest.raises(RuntimeError):
        provider.request(request(), on_chunk=chunks.append)
    assert len(chunks) == 2


def test_an_exception_from_on_chunk_stops_the_stream():
    seen = []

    def on_chunk(chunk):
        seen.append(chunk)
        raise KeyError("stop")

    with pytest.raises(KeyError):
        ScriptedProvider(stream("a", "b", "c")).request(request(), on_chunk=on_chunk)
    assert len(seen) == 1


# -- FunctionProvider -------------------------------------------------------------------------
def echo(model_request: ModelRequest):
    last = model_request.messages[-1].content
    if last == "add":
        return tool_call("add", {"a": 1, "b": 2}, id="c1")
    return f"You said {last}"


def test_function_provider_decides_each_answer_from_the_request():
    provider = FunctionProvider(echo)
    assert provider.request(request("hello")).content == "You said hello"
    assert [call.name for call in provider.request(request("add")).tool_calls] == ["add"]
    assert [r.messages[-1].content for r in provider.requests] == ["hello", "add"]


def test_function_provider_streams_the_text_word_by_word():
    chunks = []
    response = FunctionProvider(echo).request(request("big news"), on_chunk=chunks.append)
    assert [chunk.text for chunk in chunks] == ["You ", "said ", "big ", "news"]
    assert response.content == "You said big news"


def test_function_provider_keeps_parsed_output_and_finish_reason_when_streaming():
    def structured(model_request):
        return reply('{"n": 1}', parsed={"n": 1}, finish_reason="stop")

    response = FunctionProvider(structured).request(request(), on_chunk=lambda chunk: None)
    assert (response.parsed, response.finish_reason) == ({"n": 1}, "stop")


def test_function_provider_raises_a_returned_exception():
    provider = FunctionProvider(lambda model_request: RateLimitError("busy"))
    with pytest.raises(RateLimitError, match="busy"):
        provider.request(request())


def test_function_provider_plays_a_returned_stream():
    chunks = []
    FunctionProvider(lambda r: stream("x", "y")).request(request(), on_chunk=chunks.append)
    assert [chunk.text for chunk in chunks] == ["x", "y"]


# -- block_network ----------------------------------------------------------------------------
def test_network_is_blocked_in_tests():
    with pytest.raises(NetworkBlockedError, match=r"203\.0\.113\.1"):
        socket.create_connection(("203.0.113.1", 80), timeout=1)


def test_network_blocked_error_is_a_connection_error():
    assert issubclass(NetworkBlockedError, ConnectionError)


@pytest.fixture
def loopback_server():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server
    server.close()


def test_block_network_allows_loopback(loopback_server):
    with block_network():
        client = socket.create_connection(loopback_server.getsockname(), timeout=1)
        accepted, _ = loopback_server.accept()
        client.sendall(b"ping")
        assert accepted.recv(4) == b"ping"
        client.close()
        accepted.close()


def test_block_network_restores_connect_when_it_exits():
    before = socket.socket.connect
    with block_network():
        assert socket.socket.connect is not before
    assert socket.socket.connect is before


# -- registry ---------------------------------------------------------------------------------
@pytest.fixture
def registered_names():
    names: list[str] = []
    yield names
    for name in names:
        providers.unregister(name)


def test_register_and_resolve_a_provider(registered_names):
    provider = ScriptedProvider()
    registered_names.append("mine")
    assert providers.register("mine", provider) is provider
    assert providers.resolve("mine:model-x") == (provider, "model-x")
    assert providers.registered()["mine"] is provider


def test_register_replaces_an_earlier_provider(registered_names):
    first, second = ScriptedProvider(), ScriptedProvider()
    registered_names.append("mine")
    providers.register("mine", first)
    providers.register("mine", second)
    assert providers.get("mine") is second


def test_unregister_forgets_the_provider(registered_names):
    providers.register("temporary", ScriptedProvider())
    providers.unregister("temporary")
    with pytest.raises(UnknownProviderError):
        providers.resolve("temporary:model")
    providers.unregister("temporary")  # no error the second time


def test_resolve_with_an_explicit_provider(registered_names):
    provider = ScriptedProvider()
    registered_names.append("local")
    providers.register("local", provider)
    assert providers.resolve("llama-3-8b", "local") == (provider, "llama-3-8b")


@pytest.mark.parametrize("name", ["", "has:colon"])
def test_register_refuses_invalid_names(name):
    with pytest.raises(ConfigurationError, match="Invalid provider name"):
        providers.register(name, ScriptedProvider())


def test_register_refuses_what_is_not_a_provider():
    with pytest.raises(ConfigurationError, match="not an agentloop Provider"):
        providers.register("fake", object())  # type: ignore[arg-type]


def test_unknown_provider_error_names_the_registered_providers(registered_names):
    registered_names.extend(["alpha", "beta"])
    providers.register("alpha", ScriptedProvider())
    providers.register("beta", ScriptedProvider())
    with pytest.raises(UnknownProviderError) as error:
        providers.resolve("gamma:model")
    message = str(error.value)
    assert "'gamma'" in message
    assert "alpha" in message
    assert "beta" in message
    assert "providers.register('gamma'" in message


def test_unknown_provider_error_names_the_process_and_how_every_process_gets_one():
    with pytest.raises(UnknownProviderError) as error:
        providers.get("nowhere")
    message = str(error.value)

    assert "\n" not in message
    assert f"in process {os.getpid()} (" in message
    assert "AGENTLOOP['PROVIDERS']['nowhere'] = {\"class\":" in message
    assert "AppConfig.ready()" in message
    assert "install a package that offers it (entry point group 'agentloop.providers')" in message
    assert 'see "Model providers" in the agentloop docs' in message


def test_unknown_provider_error_lists_the_configured_providers_not_the_built_ins_used(
    settings, monkeypatch
):
    monkeypatch.setattr(providers, "_registry", {})  # none of other tests' registrations
    monkeypatch.setattr(providers, "_made", set())
    settings.AGENTLOOP = {
        "PROVIDERS": {
            "anthropic": {"api_key": "sk-test"},  # a built-in given settings: configured
            "offline": {"class": "agentloop.testing.OfflineProvider"},
            "typo": {"api_key": "sk-test"},  # no class, not a built-in: makes no provider
        }
    }
    providers.get("openai")  # a built-in made on first use, configured by nobody
    providers.register("mine", ScriptedProvider())
    with pytest.raises(UnknownProviderError) as error:
        providers.get("gamma")

    assert "(registered or configured there: anthropic, mine, offline)" in str(error.value)
    providers.unregister("mine")
    assert providers.available() == ["anthropic", "offline"]


def test_unknown_provider_error_for_a_setting_without_a_class_says_so(settings):
    settings.AGENTLOOP = {"PROVIDERS": {"typo": {"api_key": "sk-test"}}}
    with pytest.raises(UnknownProviderError, match=r"\['typo'\] has no \"class\""):
        providers.get("typo")


def test_unknown_provider_error_with_nothing_registered_says_none(settings, monkeypatch):
    settings.AGENTLOOP = {}
    monkeypatch.setattr(providers, "_registry", {})
    with pytest.raises(UnknownProviderError, match=r"registered or configured there: none\)"):
        providers.get("offline")


def test_this_process_names_the_command(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/venv/bin/celery", "-A", "mysite", "worker", "-l", "INFO"])
    assert providers.this_process() == f"process {os.getpid()} (celery -A mysite worker)"


# -- OfflineProvider --------------------------------------------------------------------------
def test_offline_provider_echoes_by_default(settings):
    settings.AGENTLOOP = {"PROVIDERS": {"offline": {"class": "agentloop.testing.OfflineProvider"}}}
    provider = providers.get("offline")

    assert isinstance(provider, OfflineProvider)
    assert provider.request(request("Are you there?")).content == "You said: Are you there?"


def test_offline_provider_answers_from_its_settings(settings):
    settings.AGENTLOOP = {
        "PROVIDERS": {
            "offline": {
                "class": "agentloop.testing.OfflineProvider",
                "reply": "Heard {message} {not a field}",
                "replies": {"Are you there?": "Installed."},
            }
        }
    }
    provider = providers.get("offline")

    assert provider.request(request("  Are you there? ")).content == "Installed."
    assert provider.request(request("hi")).content == "Heard hi {not a field}"


def test_offline_provider_answers_the_latest_user_message_whatever_came_after():
    provider = OfflineProvider(reply="Got {message}")
    later = ModelRequest(
        model="m",
        messages=[
            Message(role="user", content="first"),
            Message(role="assistant", content="x"),
            Message(role="user", content="second"),
            Message(role="assistant", content="y"),
        ],
    )
    assert provider.request(later).content == "Got second"


def test_offline_provider_streams_word_by_word():
    chunks = []
    answer = OfflineProvider(reply="one two three").request(request(), on_chunk=chunks.append)

    assert [chunk.text for chunk in chunks] == ["one ", "two ", "three"]
    assert answer.content == "one two three"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"reply": 3}, r"\['offline'\]\['reply'\] must be a string"),
        ({"replies": ["a"]}, r"\['replies'\] must be a dict"),
        ({"delay": -1}, r"\['delay'\] must be a number of seconds >= 0"),
        ({"delay": "1"}, r"\['delay'\] must be"),
    ],
)
def test_offline_provider_refuses_wrong_settings(settings, options, error):
    settings.AGENTLOOP = {
        "PROVIDERS": {"offline": {"class": "agentloop.testing.OfflineProvider", **options}}
    }
    with pytest.raises(ConfigurationError, match=error):
        providers.get("offline")


def test_unknown_provider_error_is_a_configuration_error():
    assert issubclass(UnknownProviderError, ConfigurationError)


@pytest.mark.parametrize(
    ("model", "provider", "expected"),
    [
        ("openai:gpt-x", None, ("openai", "gpt-x")),
        ("local:llama3:8b", None, ("local", "llama3:8b")),
        ("gpt-4.1-mini", None, ("openai", "gpt-4.1-mini")),
        ("o3-mini", None, ("openai", "o3-mini")),
        ("claude-sonnet-4", None, ("anthropic", "claude-sonnet-4")),
        ("gemini-2.5-flash", None, ("gemini", "gemini-2.5-flash")),
        ("llama3", "ollama", ("ollama", "llama3")),
        ("openai:gpt-x", "local", ("local", "openai:gpt-x")),
    ],
)
def test_split_model(model, provider, expected):
    assert providers.split_model(model, provider) == expected


@pytest.mark.parametrize("model", ["llama3", "", "openai:", ":gpt-x"])
def test_split_model_refuses_a_model_nobody_is_known_to_serve(model):
    with pytest.raises(ConfigurationError, match="provider:model"):
        providers.split_model(model)


def test_provider_cost_is_unknown_by_default():
    assert ScriptedProvider().cost("test", TokenUsage(input_tokens=10)) is None
    assert isinstance(ScriptedProvider(), Provider)


# -- OfflineProvider's tool rules ---------------------------------------------------------------
@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
def divide(a: float, b: float) -> float:
    """Divides a by b."""
    return a / b


ADD_RULE = {
    "match": r"(?P<a>\d+)\s*\+\s*(?P<b>\d+)",
    "tool": "add",
    "arguments": {"a": "{a}", "b": "{b}"},
    "answer": "{a} + {b} = {result}.",
}
DIVIDE_RULE = {
    "match": r"(?P<a>\d+)\s*/\s*(?P<b>\d+)",
    "tool": "divide",
    "arguments": {"a": "{a}", "b": "{b}"},
}


def offline_with(settings, *rules, **options):
    settings.AGENTLOOP = {
        "PROVIDERS": {
            "offline": {
                "class": "agentloop.testing.OfflineProvider",
                "rules": list(rules),
                **options,
            }
        }
    }
    return providers.get("offline")


def test_offline_rules_call_the_tool_with_the_groups_then_answer_from_its_result(settings):
    offline_with(settings, ADD_RULE)
    chat = agentloop.chat("offline:any").with_tools(add)

    answer = chat.ask("What is 2 + 40?")

    assert answer.content == "2 + 40 = 42."
    (asking,) = [m for m in chat.messages if m.tool_calls]
    assert [(c.id, c.name, c.arguments) for c in asking.tool_calls] == [
        ("offline_1", "add", {"a": 2, "b": 40})  # the tool's parameters are integers
    ]
    assert [m.content for m in chat.messages if m.role == "tool"] == ["42"]


def test_every_matching_rule_calls_its_tool_in_one_answer_in_the_rules_order(settings):
    offline_with(settings, DIVIDE_RULE, ADD_RULE)
    chat = agentloop.chat("offline:any").with_tools(add, divide)

    answer = chat.ask("1 + 2 and 9 / 3")

    (asking,) = [m for m in chat.messages if m.tool_calls]
    assert [c.name for c in asking.tool_calls] == ["divide", "add"]
    assert answer.content == "3.0 1 + 2 = 3."  # DIVIDE_RULE's answer is its default: {result}


@tool
def flags(count: int, ratio: float, loud: bool, name: str) -> str:
    """Echoes its arguments."""
    return f"{count} {ratio} {loud} {name}"


def test_filled_arguments_take_the_json_type_of_the_tools_parameters():
    rule = {
        "match": r"(?P<c>\S+) (?P<r>\S+) (?P<l>\S+)",
        "tool": "flags",
        "arguments": {"count": "{c}", "ratio": "{r}", "loud": "{l}", "name": "{c}"},
    }
    provider = OfflineProvider(rules=[rule])

    def arguments(text: str) -> dict:
        asked = ModelRequest(
            model="m", messages=[Message(role="user", content=text)], tools=[flags.definition()]
        )
        return provider.request(asked).tool_calls[0].arguments

    assert arguments("3 2.5 true") == {"count": 3, "ratio": 2.5, "loud": True, "name": "3"}
    assert arguments("3 2 False") == {"count": 3, "ratio": 2, "loud": False, "name": "3"}
    # What doesn't read as the type stays the text: the tool's validation then says why.
    assert arguments("x y z") == {"count": "x", "ratio": "y", "loud": "z", "name": "x"}


def test_a_rule_whose_tool_the_chat_does_not_offer_is_skipped(settings):
    offline_with(settings, ADD_RULE, reply="No tool for {message}")
    chat = agentloop.chat("offline:any")

    assert chat.ask("2 + 2").content == "No tool for 2 + 2"
    assert not [m for m in chat.messages if m.tool_calls]


def test_a_message_no_rule_matches_gets_the_reply(settings):
    offline_with(settings, ADD_RULE, replies={"Hi": "Hello."})
    chat = agentloop.chat("offline:any").with_tools(add)

    assert chat.ask("Hi").content == "Hello."


def test_an_error_result_is_told_as_the_tool_failing(settings):
    offline_with(settings, DIVIDE_RULE)
    chat = agentloop.chat("offline:any").with_tools(divide)

    answer = chat.ask("7 / 0")

    assert answer.content.startswith("The divide tool failed: ")
    assert "division by zero" in answer.content


def test_offline_rules_take_one_call_when_parallel_calls_are_off():
    provider = OfflineProvider(rules=[DIVIDE_RULE, ADD_RULE])
    asked = ModelRequest(
        model="m",
        messages=[Message(role="user", content="1 + 2, 9 / 3")],
        tools=[add.definition(), divide.definition()],
        parallel_tool_calls=False,
    )

    assert [call.name for call in provider.request(asked).tool_calls] == ["divide"]


def test_offline_rules_stream_the_tool_calls_and_the_user_text_stays_text():
    provider = OfflineProvider(rules=[{"match": r"say (?P<what>.+)", "tool": "add"}])
    asked = ModelRequest(
        model="m",
        messages=[Message(role="user", content="say {b} {result}")],
        tools=[add.definition()],
    )
    chunks: list = []

    answer = provider.request(asked, on_chunk=chunks.append)

    assert [c for c in chunks if isinstance(c, ToolCallDelta)][0].name == "add"
    assert answer.tool_calls[0].arguments == {}
    filled = provider.rules[0].fill("[{what}]", provider.rules[0].match.search("say {b}"))
    assert filled == "[{b}]"  # braces from the user's message are not read as fields


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ("add", r"\['rules'\]\[0\] must be a dict with 'match' and 'tool'"),
        ({"tool": "add"}, r"\['rules'\]\[0\]\['match'\] must be a regular expression"),
        ({"match": "(", "tool": "add"}, r"\['match'\] is not a regular expression: "),
        ({"match": "x"}, r"\['rules'\]\[0\]\['tool'\] must be a tool's name"),
        ({"match": "x", "tool": "add", "arguments": []}, r"\['arguments'\] must be a dict"),
        ({"match": "x", "tool": "add", "answer": 1}, r"\['answer'\] must be a string"),
        ({"match": "x", "tool": "add", "when": "x"}, r"has unknown keys \['when'\]"),
        (
            {"match": "(?P<a>x)", "tool": "add", "answer": "{b}"},
            r"\['answer'\] uses \{b\}, which is neither a named group of 'match' nor one of "
            r"\['message', 'result'\]",
        ),
        (
            {"match": "x", "tool": "add", "arguments": {"a": "{result}"}},
            r"\['arguments'\]\['a'\] uses \{result\}",
        ),
        ({"match": "x", "tool": "add", "answer": "{"}, r"\['answer'\] is not a template"),
    ],
)
def test_offline_rules_refuse_wrong_settings_in_one_line(settings, rule, error):
    with pytest.raises(ConfigurationError, match=error) as raised:
        offline_with(settings, rule)
    assert "\n" not in str(raised.value)


def test_offline_rules_must_be_a_list(settings):
    with pytest.raises(ConfigurationError, match=r"\['rules'\] must be a list of dicts"):
        offline_with(settings, rules={"match": "x"})


PAY_RULE = {
    "match": r"pay (?P<to>\w+) (?P<amount>\d+)",
    "tool": "transfer",
    "arguments": {"amount": "{amount}", "to": "{to}"},
    "answer": "Paid {to}: {result}.",
}


@pytest.mark.django_db
def test_an_offline_rules_call_that_needs_approval_waits_then_answers_as_decided(settings, user):
    from agentloop.models import Chat
    from tests.tools import transfer

    offline_with(settings, PAY_RULE)
    paid = Chat.objects.create(model="offline:any", owner=user).with_tools(transfer)
    refused = Chat.objects.create(model="offline:any", owner=user).with_tools(transfer)
    for chat in (paid, refused):
        chat.ask("Pay bob 5")
        assert chat.is_waiting()
        assert [c.arguments for c in chat.pending_approvals()] == [{"amount": 5, "to": "bob"}]

    paid.approve("offline_1", by=user)
    refused.deny("offline_1", reason="Not today", by=user)
    paid.complete()
    refused.complete()

    assert paid.messages.last().content == "Paid bob: sent 5 to bob."
    assert refused.messages.last().content == (
        "The transfer tool failed: " + refused.tool_calls.get().result.content
    )
    assert "Not today" in refused.messages.last().content
