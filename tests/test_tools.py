"""Tools: names, descriptions and schemas, @tool, result text, import paths, and running one."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from pydantic import BaseModel, Field

from agentloop import ConfigurationError, Tool, tool
from agentloop.engine._drivers import execute_tool
from agentloop.import_paths import import_path_of, load_by_path
from agentloop.messages import ToolCall
from agentloop.tools import AskPerson, format_result, load_tool, tool_reference
from tests import tools as test_tools
from tests.tools import Weather, add, explode, refuse


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"call_{name}", name=name, arguments=arguments)


# -- Tool subclasses ----------------------------------------------------------------------
class GetWeather(Tool):
    """Gets the weather."""


class HTTPFetch(Tool):
    """Fetches a URL."""


class Described(Tool):
    """The docstring, which loses to the attribute."""

    description = "The explicit description."


class Named(Tool):
    name = "custom_name"


class Search(Tool):
    """Searches the index.

    Matches whole words only.
    """

    class Params(BaseModel):
        query: str = Field(description="What to look for")
        limit: int = Field(default=5, description="At most this many hits")
        title: str | None = None  # a property *named* title survives title stripping


class Point(BaseModel):
    x: int
    y: int


class Distance(Tool):
    """Distance of a point from the origin, squared."""

    class Params(BaseModel):
        point: Point

    def execute(self, point: Point) -> int:
        assert isinstance(point, Point)  # nested models arrive as models
        return point.x**2 + point.y**2


def test_tool_name_is_the_snake_case_of_the_class_name():
    assert Weather.name == "weather"
    assert GetWeather.name == "get_weather"
    assert HTTPFetch.name == "http_fetch"


def test_an_explicit_name_attribute_wins():
    assert Named.name == "custom_name"
    assert Named.definition().name == "custom_name"


def test_tool_description_comes_from_the_docstring():
    assert Search.description == "Searches the index.\n\nMatches whole words only."
    assert Weather.definition().description == "Gets the current weather for a city."


def test_an_explicit_description_attribute_wins_over_the_docstring():
    assert Described.description == "The explicit description."


def test_a_subclass_gets_its_own_name_and_description():
    class Parent(Tool):
        """Parent tool."""

    class ChildTool(Parent):
        """Child tool."""

    assert (ChildTool.name, ChildTool.description) == ("child_tool", "Child tool.")


def test_params_schema_has_properties_required_and_field_descriptions():
    schema = Search.definition().parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"] == {"type": "string", "description": "What to look for"}
    assert schema["properties"]["limit"] == {
        "type": "integer",
        "default": 5,
        "description": "At most this many hits",
    }


def test_params_schema_has_no_titles_but_keeps_a_property_named_title():
    schema = Search.definition().parameters
    assert "title" not in schema
    assert all("title" not in prop for prop in schema["properties"].values())
    assert "title" in schema["properties"]


def title_keys(node, under_properties=False):
    """Every "title" key in a schema, except properties that are named title."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "title" and not under_properties:
                found.append(value)
            found += title_keys(value, under_properties=key == "properties")
    elif isinstance(node, list):
        for item in node:
            found += title_keys(item)
    return found


def test_nested_params_schema_has_no_titles():
    schema = Distance.definition().parameters
    assert "Point" in str(schema)  # the nested model is there ($defs)
    assert title_keys(schema) == []


def test_a_tool_without_params_has_an_empty_object_schema():
    assert GetWeather.definition().parameters["properties"] == {}
    assert GetWeather.definition().parameters["type"] == "object"


# -- @tool --------------------------------------------------------------------------------
@tool
def search_docs(query: str, limit: int = 5, exact: bool = False) -> list[str]:
    """Searches the documentation.

    Args:
        query: What to look for.
        limit (int): How many hits
            to return at most.

    Returns:
        The matching page titles.
    """
    return [query] * limit


@tool(name="lookup", description="Looks a word up.", idempotent=False)
def find_word(word: str) -> str:
    """This docstring is not the description."""
    return word.upper()


def test_decorated_function_becomes_a_tool_named_after_the_function():
    assert issubclass(search_docs, Tool)
    assert search_docs.name == "search_docs"
    assert add.name == "add"


def test_decorated_function_schema_comes_from_signature_defaults_and_args_docstring():
    schema = search_docs.definition().parameters
    assert schema["required"] == ["query"]
    assert schema["properties"] == {
        "query": {"type": "string", "description": "What to look for."},
        "limit": {
            "type": "integer",
            "default": 5,
            "description": "How many hits to return at most.",
        },
        "exact": {"type": "boolean", "default": False},
    }


def test_decorated_function_description_is_the_docstring_summary_without_sections():
    assert search_docs.description == "Searches the documentation."


@pytest.mark.parametrize(
    "doc",
    [
        "Finds a city.\n\nArgs:\n    name: The city's name,\n        in any case.\n\n"
        "Returns:\n    Its id.",
        "Finds a city.\n\nParameters\n----------\nname : str\n    The city's name,\n"
        "    in any case.\n\nReturns\n-------\nint\n    Its id.",
        "Finds a city.\n\n:param name: The city's name,\n    in any case.\n:returns: Its id.",
    ],
    ids=["google", "numpy", "rest"],
)
def test_a_docstring_in_each_style_gives_the_description_and_the_arguments(doc):
    def find_city(name: str) -> int:
        return 1

    find_city.__doc__ = doc
    made = tool(find_city)

    assert made.description == "Finds a city."
    assert made.definition().parameters["properties"]["name"] == {
        "type": "string",
        "description": "The city's name, in any case.",
    }


def test_decorated_function_accepts_name_description_and_idempotent_overrides():
    assert find_word.name == "lookup"
    assert find_word.description == "Looks a word up."
    assert find_word.idempotent is False
    assert search_docs.idempotent is True


def test_decorated_function_is_still_reachable_as_function():
    assert add.function(2, 3) == 5
    assert find_word.function("hi") == "HI"


def test_decorated_function_with_var_args_is_refused():
    with pytest.raises(ConfigurationError, match="args"):

        @tool
        def anything(*values: int) -> int:
            return sum(values)


def test_decorated_function_rejects_unknown_arguments():
    outcome = execute_tool(add, call("add", a=1, b=2, c=3))
    assert outcome.is_error
    assert "c" in outcome.content


# -- result text ----------------------------------------------------------------------------
def test_format_result_returns_strings_as_they_are():
    assert format_result("plain {not json}") == "plain {not json}"


def test_format_result_renders_dicts_and_lists_as_json():
    assert format_result({"city": "Paris", "temp": 21}) == '{"city": "Paris", "temp": 21}'
    assert format_result([1, "two", None]) == '[1, "two", null]'
    assert format_result(3) == "3"


def test_format_result_keeps_non_ascii_text_readable():
    assert format_result({"city": "Zürich"}) == '{"city": "Zürich"}'


def test_format_result_renders_pydantic_models_as_json():
    assert format_result(Point(x=1, y=2)) == '{"x":1,"y":2}'


def test_format_result_renders_models_dates_and_decimals_nested_in_containers_as_json():
    value = {
        "points": [Point(x=1, y=2)],
        "at": datetime(2030, 1, 2, 3, 4, tzinfo=UTC),
        "price": Decimal("9.50"),
    }
    assert format_result(value) == (
        '{"points": [{"x": 1, "y": 2}], "at": "2030-01-02T03:04:00Z", "price": "9.50"}'
    )


def test_format_result_refuses_values_that_are_not_json_serialisable():
    with pytest.raises(ValueError, match="serialize"):
        format_result({"thing": object()})


# -- import paths ---------------------------------------------------------------------------
def test_load_by_path_loads_classes_and_decorated_functions():
    assert load_by_path("tests.tools.Weather") is Weather
    assert load_by_path("tests.tools.add") is add


def test_load_by_path_loads_nested_names():
    assert load_by_path("tests.test_tools.Search.Params") is Search.Params


def test_load_by_path_error_names_the_path_when_the_module_is_missing():
    with pytest.raises(ConfigurationError, match=r"'no_such_package\.tools\.Thing'"):
        load_by_path("no_such_package.tools.Thing")


def test_load_by_path_error_names_the_path_when_the_attribute_is_missing():
    with pytest.raises(ConfigurationError, match=r"'tests\.tools\.NoSuchTool'") as error:
        load_by_path("tests.tools.NoSuchTool")
    assert "NoSuchTool" in str(error.value)


def test_load_by_path_error_names_the_path_when_the_module_fails_to_import(tmp_path, monkeypatch):
    (tmp_path / "broken_tools_module.py").write_text(
        textwrap.dedent("""
            import missing_dependency_for_agentloop_tests  # noqa: F401
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError) as error:
        load_by_path("broken_tools_module.Tool")
    assert "'broken_tools_module.Tool'" in str(error.value)
    assert "missing_dependency_for_agentloop_tests" in str(error.value)


def test_import_path_of_module_level_tools():
    assert import_path_of(Weather) == "tests.tools.Weather"
    assert import_path_of(add) == "tests.tools.add"


def test_import_path_of_refuses_a_local_class():
    class LocalTool(Tool):
        """Defined inside a function."""

    with pytest.raises(ConfigurationError, match="module level"):
        import_path_of(LocalTool)


def test_import_path_of_refuses_a_local_decorated_function():
    @tool
    def local_function() -> str:
        """Defined inside a function."""
        return "x"

    with pytest.raises(ConfigurationError, match="module level"):
        import_path_of(local_function)


def test_import_path_of_refuses_an_object_its_path_does_not_load():
    impostor = type("Weather", (Tool,), {"__module__": "tests.tools", "__qualname__": "Weather"})
    with pytest.raises(ConfigurationError, match=r"not importable as 'tests\.tools\.Weather'"):
        import_path_of(impostor)


def shell_defined_tool():
    """A @tool function made as in ``manage.py shell``: its module is the shell command's."""
    namespace = {"__name__": "django.core.management.commands.shell", "tool": tool}
    source = '@tool\ndef shell_tool() -> str:\n    """From the shell."""\n    return "x"\n'
    exec(compile(source, "<console>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace["shell_tool"]


def test_a_tool_function_from_the_shell_is_refused_as_a_function_with_the_fix():
    with pytest.raises(ConfigurationError) as raised:
        tool_reference(shell_defined_tool())

    message = str(raised.value)
    assert message.startswith("The @tool function 'shell_tool' is not importable as ")
    assert "define tools of persisted chats in a module" in message
    assert "class" not in message


def test_a_tool_class_defined_in_a_function_is_refused_with_the_fix():
    class LocalTool(Tool):
        """Defined inside a function."""

        def execute(self) -> str:
            return "x"

    with pytest.raises(ConfigurationError) as raised:
        tool_reference(LocalTool)

    assert "The tool class " in str(raised.value)
    assert "define tools of persisted chats in a module" in str(raised.value)


# -- running one call -------------------------------------------------------------------------
def test_execute_tool_returns_the_result_text():
    outcome = execute_tool(add, call("add", a=2, b=3))
    assert (outcome.content, outcome.is_error, outcome.error) == ("5", False, None)


def test_execute_tool_renders_a_dict_result_as_json():
    outcome = execute_tool(Weather, call("weather", city="Oslo"))
    assert outcome.content == '{"city": "Oslo", "temperature_c": 21, "sky": "clear"}'


def test_execute_tool_passes_nested_models_to_execute():
    outcome = execute_tool(Distance, call("distance", point={"x": 3, "y": 4}))
    assert (outcome.content, outcome.is_error) == ("25", False)


def test_execute_tool_turns_invalid_arguments_into_an_error_outcome():
    outcome = execute_tool(add, call("add", a="not a number"))
    assert outcome.is_error
    assert outcome.content.startswith("Invalid arguments for tool 'add'")
    assert "a:" in outcome.content
    assert "b: Field required" in outcome.content
    assert outcome.error == outcome.content


def test_execute_tool_turns_a_tool_error_into_an_error_outcome_with_its_message():
    outcome = execute_tool(refuse, call("refuse", reason="no way"))
    assert outcome.is_error
    assert outcome.content == "refused: no way"
    assert "ToolError" in outcome.error


def test_execute_tool_turns_an_unexpected_exception_into_an_error_outcome_with_traceback():
    outcome = execute_tool(explode, call("explode"))
    assert outcome.is_error
    assert outcome.content == "Tool 'explode' failed: RuntimeError: kaboom"
    assert outcome.error.startswith("Traceback (most recent call last):")
    assert 'raise RuntimeError("kaboom")' in outcome.error


@tool
def return_unserialisable() -> object:
    """Returns something JSON can't hold."""
    return {"handle": object()}


@tool
def return_circular() -> list:
    """Returns a list that contains itself."""
    loop: list = []
    loop.append(loop)
    return loop


def test_execute_tool_turns_an_unserialisable_return_value_into_an_error_outcome():
    outcome = execute_tool(return_unserialisable, call("return_unserialisable"))
    assert outcome.is_error
    assert outcome.content.startswith("Tool 'return_unserialisable' failed:")
    assert "Traceback" in outcome.error


def test_execute_tool_turns_a_circular_return_value_into_an_error_outcome():
    outcome = execute_tool(return_circular, call("return_circular"))
    assert outcome.is_error
    assert "Circular reference" in outcome.content


class Introspect(Tool):
    """Reports what it knows about its call."""

    def execute(self) -> dict[str, object]:
        return {"id": self.tool_call.id, "chat": self.context.chat}


def test_execute_tool_gives_the_tool_its_call_and_chat():
    outcome = execute_tool(Introspect, call("introspect"), chat="the chat")
    assert outcome.content == '{"id": "call_introspect", "chat": "the chat"}'


def test_a_tool_without_execute_becomes_an_error_outcome():
    outcome = execute_tool(GetWeather, call("get_weather"))
    assert outcome.is_error
    assert "NotImplementedError" in outcome.content


def test_test_tools_module_tools_are_all_loadable_by_their_paths():
    for name in ("add", "Weather", "refuse", "explode", "slow", "record", "CancelChat"):
        obj = getattr(test_tools, name)
        assert load_by_path(import_path_of(obj)) is obj


def test_a_chat_row_names_the_ready_made_tool_by_its_public_path():
    """Rows outlive module layouts: ``AskPerson`` is stored as ``agentloop.tools.AskPerson``,
    never as the private module that holds its code, and loads back from that."""
    assert tool_reference(AskPerson) == "agentloop.tools.AskPerson"
    assert load_tool("agentloop.tools.AskPerson") is AskPerson
