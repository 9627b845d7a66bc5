"""Tools the model can call: ``Tool`` classes, the ``@tool`` decorator, and how they run.

A tool is a class with a pydantic ``Params`` model and an ``execute`` method::

    class Weather(Tool):
        \"\"\"Gets the current weather for a city.\"\"\"

        class Params(BaseModel):
            city: str = Field(description="City name")

        def execute(self, city: str) -> str:
            ...

or a plain function with ``@tool`` (the schema comes from its signature and docstring).
The return value becomes the result text: ``str`` as is, anything else as JSON.
Raise :class:`~agentloop.ToolError` to send the model an error result.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from functools import lru_cache
from typing import Any, ClassVar, get_type_hints, overload

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from ..exceptions import ConfigurationError, NeedsInput
from ..messages import ToolCall, ToolDefinition
from ._context import Handoff, ToolContext


def snake_case(name: str) -> str:
    """``GetWeather`` -> ``get_weather``; ``HTTPFetch`` -> ``http_fetch``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.replace("-", "_").lower()


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Tool:
    """Base class of tools. Subclasses set ``Params`` and implement ``execute``.

    Class attributes:
        name: the name the model calls (default: snake case of the class name).
        description: what the tool does (default: the class docstring).
        Params: pydantic model of the arguments (default: no arguments).
        idempotent: ``False`` means: if a run was interrupted by a crash, don't
            run it again; the model gets an error result saying so.
        deferred: ``True`` means: agentloop never runs the call; it waits until its
            result comes from outside (``chat.submit_result``).
        transactional: ``True`` means: the tool's database writes, its result row and its
            call's state commit in one transaction (docs/transactional-tools.md), so its
            database side effect happens exactly once.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = _NoParams
    idempotent: ClassVar[bool] = True
    #: True, or a callable ``(arguments: dict) -> bool`` deciding per call: the call runs
    #: only after ``chat.approve(...)`` for exactly these arguments (no decision: no run).
    requires_approval: ClassVar[bool | Callable[[dict[str, Any]], bool]] = False
    #: True: the call is not run here; the chat waits for ``chat.submit_result(...)``.
    deferred: ClassVar[bool] = False
    #: True: ``execute`` runs inside the step's database transaction, with the call's result
    #: and state: all of it commits, or none (a crash, an error, a lost lease). A run cut
    #: short left nothing behind, so it is run again. For database-only side effects.
    transactional: ClassVar[bool] = False

    #: set on the instance before ``execute`` runs.
    context: ToolContext

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = snake_case(cls.__name__)
        if not cls.__dict__.get("description"):
            cls.description = inspect.cleandoc(cls.__doc__ or "")
        _check_transactional(cls)

    def execute(self, *args: Any, **arguments: Any) -> Any:
        """Run the tool with validated arguments; return ``str`` or anything JSON-able.

        May be ``async def``: async verbs await it on their event loop, sync verbs run it
        to completion; a sync ``execute`` always runs on a thread, never on a loop."""
        raise NotImplementedError(f"{type(self).__name__}.execute() is not implemented")

    @classmethod
    def is_async(cls) -> bool:
        """True when ``execute`` is ``async def``."""
        return inspect.iscoroutinefunction(cls.execute)

    @property
    def tool_call(self) -> ToolCall:
        """The call being answered (``.id`` is a good idempotency key)."""
        return self.context.tool_call

    @classmethod
    def definition(cls) -> ToolDefinition:
        """The name, description and JSON schema sent to providers."""
        return _definition(cls)  # type: ignore[arg-type]

    @classmethod
    def needs_approval(cls, arguments: dict[str, Any]) -> bool:
        """Whether this call waits for a person's approval."""
        rule = cls.__dict__.get("requires_approval", cls.requires_approval)
        if isinstance(rule, staticmethod):
            rule = rule.__func__
        if callable(rule):
            # A rule that fails must not wave a call through: fail closed.
            try:
                return bool(rule(arguments))
            except Exception:
                return True
        return bool(rule)

    @classmethod
    def parse_arguments(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validate raw model arguments; raises ``pydantic.ValidationError``."""
        params = cls.Params.model_validate(arguments)
        # Keep nested models as models: execute() gets what Params declares.
        return {name: getattr(params, name) for name in type(params).model_fields}

    @classmethod
    def unexpected_keys(cls, arguments: dict[str, Any]) -> list[str]:
        """Keys of ``arguments`` the tool takes no parameter for (``Params`` would drop them
        unless it allows extra keys), in their order."""
        if cls.Params.model_config.get("extra") == "allow":
            return []
        accepted: set[Any] = set()
        for name, field in cls.Params.model_fields.items():
            accepted.update((name, field.alias, field.validation_alias))
        return [key for key in arguments if key not in accepted]


def _check_transactional(cls: type[Tool]) -> None:
    """Refuse, when the tool is defined, options a transactional tool can't have."""
    if cls.transactional is False:
        return
    function = cls.__dict__.get("function")
    where = (
        f"@tool {getattr(function, '__name__', cls.__name__)}"
        if function is not None
        else f"Tool {cls.__qualname__}"
    )
    if cls.transactional is not True:
        raise ConfigurationError(f"{where}: transactional must be True or False")
    if cls.is_async():
        raise ConfigurationError(
            f"{where}: a transactional tool must be a plain def, not async def: the ORM calls "
            "of an async tool run on other threads, outside the step's transaction "
            "(async verbs run a def tool on the database's thread)"
        )
    if cls.deferred:
        raise ConfigurationError(
            f"{where}: a deferred tool is never run by agentloop, so there is nothing to run "
            "in a transaction: drop transactional=True or deferred=True"
        )
    if not cls.idempotent:
        raise ConfigurationError(
            f"{where}: transactional=True runs a call cut short by a crash again (its writes "
            "were rolled back), idempotent=False forbids that: drop idempotent=False, or "
            "transactional=True if the tool has effects outside the database"
        )


@lru_cache(maxsize=512)
def _definition(cls: type[Tool]) -> ToolDefinition:
    schema = arguments_schema(cls.Params.model_json_schema())
    return ToolDefinition(name=cls.name, description=cls.description, parameters=schema)


def arguments_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema of tool arguments as providers take it: an object, without titles."""
    schema.pop("title", None)
    _strip_titles(schema)
    schema.setdefault("properties", {})
    schema.setdefault("type", "object")
    return schema


def _strip_titles(node: Any) -> None:
    # pydantic adds a "title" to every property; providers don't need them and
    # they cost tokens. A property *named* "title" is kept (it's under "properties").
    if isinstance(node, dict):
        for key, value in list(node.items()):
            if key == "properties" and isinstance(value, dict):
                for prop in value.values():
                    if isinstance(prop, dict):
                        prop.pop("title", None)
                    _strip_titles(prop)
            elif key == "title" and isinstance(value, str):
                del node[key]
            else:
                _strip_titles(value)
    elif isinstance(node, list):
        for item in node:
            _strip_titles(item)


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (summary and body, without sections such as ``Returns:``) and the
    parameters' descriptions of a docstring in Google, NumPy, reST or Epydoc style."""
    parsed = docstring_parser.parse(doc)
    summary = "\n\n".join(
        part for part in (parsed.short_description, parsed.long_description) if part
    )
    params = {
        param.arg_name: " ".join(param.description.split())
        for param in parsed.params
        if param.description
    }
    return summary, params


class FunctionTool(Tool):
    """A tool made from a function by ``@tool``; the function is ``.function``.

    A parameter annotated :class:`ToolContext` is not shown to the model: it receives
    the call's context (``context.tool_call.id`` as an idempotency key, ``context.chat``).
    """

    function: ClassVar[Callable[..., Any]]
    context_parameter: ClassVar[str | None] = None

    @classmethod
    def is_async(cls) -> bool:
        return inspect.iscoroutinefunction(cls.function)

    def execute(self, *args: Any, **arguments: Any) -> Any:
        parameter = type(self).context_parameter
        if parameter:
            arguments[parameter] = self.context
        return type(self).function(**arguments)


@overload
def tool(function: Callable[..., Any], /) -> type[FunctionTool]: ...


@overload
def tool(
    function: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = True,
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
    deferred: bool = False,
    transactional: bool = False,
) -> Callable[[Callable[..., Any]], type[FunctionTool]]: ...


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = True,
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
    deferred: bool = False,
    transactional: bool = False,
) -> type[FunctionTool] | Callable[[Callable[..., Any]], type[FunctionTool]]:
    """Make a tool from a function: ``@tool`` or ``@tool(name=..., idempotent=False)``.
    With ``deferred=True`` the function only describes the call: it is never run. With
    ``transactional=True`` its database writes commit with its result, or not at all.

    The arguments' schema comes from the type hints and defaults; descriptions
    come from the docstring's summary and its ``Args:`` section.
    """

    def build(fn: Callable[..., Any]) -> type[FunctionTool]:
        summary, arg_docs = _split_docstring(fn.__doc__ or "")
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        context_parameter = None
        for param in inspect.signature(fn).parameters.values():
            if hints.get(param.name) is ToolContext:
                context_parameter = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigurationError(
                    f"@tool {fn.__name__}: *args and **kwargs can't be described"
                )
            annotation = hints.get(param.name, Any)
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (
                annotation,
                FieldInfo(default=default, description=arg_docs.get(param.name)),
            )
        params_model = create_model(
            f"{fn.__name__}_params",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
        attrs: dict[str, Any] = {
            "name": name or fn.__name__,
            "description": description if description is not None else summary,
            "Params": params_model,
            "idempotent": idempotent,
            "requires_approval": staticmethod(requires_approval)
            if callable(requires_approval)
            else requires_approval,
            "deferred": deferred,
            "transactional": transactional,
            "function": staticmethod(fn),
            "context_parameter": context_parameter,
            "__module__": fn.__module__,
            "__qualname__": fn.__qualname__,
            "__doc__": fn.__doc__,
        }
        return type(fn.__name__, (FunctionTool,), attrs)

    if function is not None:
        return build(function)
    return build


class AskPerson(Tool):
    """Asks the person using this chat a question and waits for their answer."""

    name = "ask_person"

    class Params(BaseModel):
        question: str = Field(description="The question, written to stand on its own.")

    def execute(self, question: str) -> str:
        raise NeedsInput(question)


def format_result(value: Any) -> str:
    """A tool's return value as result text: ``str`` as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    # Nested models, dates, decimals and sets become JSON too; anything pydantic can't
    # serialise raises, and the tool runner turns that into an error result.
    return json.dumps(value, default=to_jsonable_python, ensure_ascii=False)


@dataclass(slots=True, eq=False)
class ToolOutcome:
    """The result of running one call: text for the model, and what went wrong, if anything.

    An outcome with ``wait_reason`` is no result: the call waits (for a person's
    approval or answer, or for a subagent).
    """

    content: str = ""
    _: KW_ONLY
    is_error: bool = False
    #: the exception (type, message and traceback) for the record, not for the model.
    error: str | None = None
    wait_reason: str | None = None
    question: str | None = None
    after_wait: Callable[[], Any] | None = None
    #: the handoff the call asked for, made with its result (``ToolContext.hand_off``).
    handoff: Handoff | None = None


def describe_validation_error(tool_name: str, error: ValidationError) -> str:
    """A short, model-readable account of invalid arguments."""
    problems = []
    for item in error.errors(include_url=False):
        where = ".".join(_name(part) for part in item["loc"]) or "arguments"
        problems.append(f"{where}: {item['msg']}")
    return f"Invalid arguments for tool {tool_name!r}: " + "; ".join(problems)


def arguments_problem(tool_class: type[Tool], arguments: dict[str, Any]) -> str | None:
    """Why ``tool_class`` can't run with ``arguments`` as they are (one line): values its
    ``Params`` refuse, or keys it takes no parameter for; None when it can."""
    try:
        tool_class.parse_arguments(arguments)
    except ValidationError as exc:
        return describe_validation_error(tool_class.name, exc)
    unexpected = tool_class.unexpected_keys(arguments)
    if unexpected:
        keys = ", ".join(json.dumps(str(key)) for key in unexpected)
        return f"Invalid arguments for tool {tool_class.name!r}: it takes no parameter {keys}"
    return None


def _name(part: Any) -> str:
    """A key as it is when it reads as a name, else as a JSON string: one line, whatever
    the model put in it."""
    text = str(part)
    return text if text.isidentifier() or isinstance(part, int) else json.dumps(text)
