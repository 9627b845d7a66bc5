"""Guardrails: checks a chat runs on the user's messages, on its answers and on its tool calls.

A guardrail is a callable, sync or ``async def``, that takes a :class:`GuardrailContext`
and returns a decision: :data:`PASS`, :class:`Block` (with a reason) or :class:`Replace`
(the text, or a tool call's arguments). It has one stage:

- **input**: a user message, before the model call that answers it (with
  ``run_in_parallel=True``: during that call, which is abandoned when the guardrail blocks);
- **output**: each answer's text (a final answer, or the words that come with tool calls),
  before it is kept;
- **tool**: a tool call, before a person is asked to approve it and before it runs.

::

    from agentloop.guardrails import PASS, Block, input_guardrail

    @input_guardrail
    def no_card_numbers(context):
        if CARD_NUMBER.search(context.text):
            return Block("the message contains a card number")
        return PASS

    chat.with_guardrails(no_card_numbers)   # a persisted chat keeps its import path

A guardrail must return a decision: anything else (``None`` included), an exception it
raises, or no decision within its time limit (``timeout=``, else
``AGENTLOOP["GUARDRAIL_TIMEOUT"]``) fails closed (``GuardrailError``; the chat is marked
failed). docs/guardrails.md has the whole story: what is kept, what the model sees, where
outcomes show.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, overload

from .conf import agentloop_settings
from .exceptions import ConfigurationError
from .import_paths import import_path_of, load_by_path
from .messages import Message, ToolCall
from .tools import snake_case

__all__ = [
    "PASS",
    "Block",
    "Decision",
    "Guardrail",
    "GuardrailContext",
    "Pass",
    "Replace",
    "as_guardrail",
    "guardrail_reference",
    "input_guardrail",
    "load_guardrail",
    "output_guardrail",
    "tool_guardrail",
]

Stage = Literal["input", "output", "tool"]
STAGES: Final = ("input", "output", "tool")


# -- decisions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pass:
    """Let the message, answer or tool call through as it is (use :data:`PASS`)."""


#: the decision that lets a message, an answer or a tool call through.
PASS: Final = Pass()


@dataclass(frozen=True)
class Block:
    """Stop it, for ``reason`` (shown: the chat's stop reason, the model's error result).

    An input or output block always stops the chat. A tool call's block gives the model an
    error result saying so and the turn goes on; with ``stop=True`` the chat also stops once
    the round's results are saved (the round's calls not run yet are not run)."""

    reason: str
    stop: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise TypeError(f"Block(reason) takes a string, not {type(self.reason).__name__}")


@dataclass(frozen=True)
class Replace:
    """Go on with ``text`` instead (input, output), or with ``arguments`` instead (tool).

    The text or arguments replaced are kept in the outcome (the admin shows them) unless
    ``keep_original=False`` (a redaction that must not be stored)."""

    text: str | None = None
    arguments: dict[str, Any] | None = None
    keep_original: bool = True

    def __post_init__(self) -> None:
        if (self.text is None) == (self.arguments is None):
            raise TypeError("Replace() takes text=... (input, output) or arguments=... (tool)")
        if self.text is not None and not isinstance(self.text, str):
            raise TypeError(f"Replace(text) takes a string, not {type(self.text).__name__}")
        if self.arguments is not None and not isinstance(self.arguments, dict):
            raise TypeError("Replace(arguments) takes a dict of the tool's arguments")


Decision = Pass | Block | Replace


@dataclass(frozen=True)
class GuardrailContext:
    """What a guardrail judges, and where.

    ``text`` is the user's message (input), the answer's text (output), or the call's
    arguments as JSON (tool); a guardrail before it may have replaced it. ``message`` is
    that user message or answer, with the tool calls it asks for (for a tool call: the
    answer that asked for it); ``tool_call`` the
    call, its ``name`` and ``arguments``; ``transcript`` the finished messages before
    (untrusted text, like ``text``). ``chat`` is the persisted ``Chat`` (or the in-memory
    chat); ``background`` is True in a worker's job."""

    stage: Stage
    guardrail: str
    text: str
    chat: Any = None
    message: Message | None = None
    tool_call: ToolCall | None = None
    transcript: tuple[Message, ...] = ()
    background: bool = False
    #: the guardrail runs while the model call is in flight (``run_in_parallel``).
    parallel: bool = False


Check = Callable[[GuardrailContext], "Decision | Awaitable[Decision]"]


# -- guardrails --------------------------------------------------------------------------------
class Guardrail:
    """A check at one stage: a function made one by a decorator (:func:`input_guardrail`,
    :func:`output_guardrail`, :func:`tool_guardrail`), or a subclass overriding
    :meth:`check` and setting ``stage`` (and ``name``, ``run_in_parallel``, ``tools``) as
    class attributes."""

    stage: Stage
    #: how outcomes and stop reasons name it (default: the function's or class's snake case).
    name: str = ""
    #: input guardrails: judge while the model call is in flight.
    run_in_parallel: bool = False
    #: tool guardrails: only the calls of these tools (None: every call).
    tools: frozenset[str] | None = None
    #: seconds it may take to decide; past them it fails closed (None:
    #: ``AGENTLOOP["GUARDRAIL_TIMEOUT"]``).
    timeout: float | None = None

    #: the decorated function (None for a subclass overriding ``check``).
    function: Check | None = None

    def __init__(
        self,
        function: Check | None = None,
        *,
        stage: Stage | None = None,
        name: str | None = None,
        run_in_parallel: bool | None = None,
        tools: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        stage = stage or getattr(type(self), "stage", None)
        if stage not in STAGES:
            raise ConfigurationError(
                f"A guardrail's stage is 'input', 'output' or 'tool', not {stage!r}."
            )
        self.stage = stage
        if function is None and type(self).check is Guardrail.check:
            raise ConfigurationError(
                "A guardrail needs a function, or a Guardrail subclass that overrides check()."
            )
        if function is not None:
            if not callable(function):
                raise ConfigurationError(f"{function!r} is not callable: it can't be a guardrail.")
            self.function = function
            functools.update_wrapper(self, function)
        own = name or getattr(type(self), "name", "") or ""
        if not own:
            fallback = getattr(function, "__name__", "") if function else type(self).__name__
            own = snake_case(fallback) if function is None else fallback
        self.name = str(own)
        if run_in_parallel is not None:
            self.run_in_parallel = bool(run_in_parallel)
        if tools is not None:
            self.tools = frozenset([tools] if isinstance(tools, str) else map(str, tools))
        if timeout is not None:
            self.timeout = timeout
        _check_options(stage, self.name, self.run_in_parallel, self.tools, self.timeout)

    def __repr__(self) -> str:
        parallel = " parallel" if self.run_in_parallel else ""
        return f"<{self.stage} guardrail {self.name!r}{parallel}>"

    def check(self, context: GuardrailContext) -> Decision | Awaitable[Decision]:
        """The decision about ``context`` (sync, or a coroutine to await)."""
        assert self.function is not None  # noqa: S101 - __init__ made sure of it
        return self.function(context)

    def __call__(self, context: GuardrailContext) -> Decision | Awaitable[Decision]:
        return self.check(context)

    def is_async(self) -> bool:
        """Its check is ``async def`` (an async verb awaits it on the loop)."""
        target = self.function if self.function is not None else self.check
        return inspect.iscoroutinefunction(target)

    def applies_to(self, call: ToolCall) -> bool:
        """A tool guardrail judges ``call`` (it names no tools, or names this call's)."""
        return self.tools is None or call.name in self.tools

    def time_limit(self) -> float | None:
        """Seconds it may take to decide: its own ``timeout``, else
        ``AGENTLOOP["GUARDRAIL_TIMEOUT"]`` (None: no limit)."""
        if self.timeout is not None:
            return float(self.timeout)
        limit = agentloop_settings.GUARDRAIL_TIMEOUT
        return None if limit is None else float(limit)


def _check_options(
    stage: str, name: str, run_in_parallel: bool, tools: Any, timeout: Any = None
) -> None:
    if run_in_parallel and stage != "input":
        raise ConfigurationError(
            f"Guardrail {name!r}: only input guardrails run in parallel with the model call."
        )
    if tools is not None and stage != "tool":
        raise ConfigurationError(f"Guardrail {name!r}: only tool guardrails take tools=.")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigurationError(
            f"Guardrail {name!r}: timeout= is a positive number of seconds (None: "
            f"AGENTLOOP['GUARDRAIL_TIMEOUT']), not {timeout!r}."
        )


def _decorator(stage: Stage) -> Any:
    def decorate(
        function: Check | None = None,
        *,
        name: str | None = None,
        run_in_parallel: bool = False,
        tools: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        def make(target: Check) -> Guardrail:
            return Guardrail(
                target,
                stage=stage,
                name=name,
                run_in_parallel=run_in_parallel,
                tools=tools,
                timeout=timeout,
            )

        if function is not None:
            return make(function)
        # Wrong options fail at once.
        _check_options(stage, name or "", run_in_parallel, tools, timeout)
        return make

    return decorate


@overload
def input_guardrail(function: Check, /) -> Guardrail: ...
@overload
def input_guardrail(
    *, name: str | None = None, run_in_parallel: bool = False, timeout: float | None = None
) -> Callable[[Check], Guardrail]: ...
def input_guardrail(function: Check | None = None, /, **options: Any) -> Any:
    """Make ``function(context)`` an input guardrail: it judges each user message before
    the model call that answers it; ``run_in_parallel=True`` judges during that call,
    which is abandoned (its stream closed) when the guardrail does not pass. ``timeout``:
    seconds it may take (default ``AGENTLOOP["GUARDRAIL_TIMEOUT"]``)."""
    return _decorator("input")(function, **options)


@overload
def output_guardrail(function: Check, /) -> Guardrail: ...
@overload
def output_guardrail(
    *, name: str | None = None, timeout: float | None = None
) -> Callable[[Check], Guardrail]: ...
def output_guardrail(function: Check | None = None, /, **options: Any) -> Any:
    """Make ``function(context)`` an output guardrail: it judges the text of each answer (a
    final answer, or the words that come with tool calls) before it is kept. ``timeout``:
    seconds it may take (default ``AGENTLOOP["GUARDRAIL_TIMEOUT"]``)."""
    return _decorator("output")(function, **options)


@overload
def tool_guardrail(function: Check, /) -> Guardrail: ...
@overload
def tool_guardrail(
    *, name: str | None = None, tools: Iterable[str] | None = None, timeout: float | None = None
) -> Callable[[Check], Guardrail]: ...
def tool_guardrail(function: Check | None = None, /, **options: Any) -> Any:
    """Make ``function(context)`` a tool guardrail: it judges each tool call (of the tools
    named in ``tools``, or every call) before a person is asked to approve it and before it
    runs. ``timeout``: seconds it may take (default ``AGENTLOOP["GUARDRAIL_TIMEOUT"]``)."""
    return _decorator("tool")(function, **options)


# -- what a chat is given, and how a persisted one names it --------------------------------------
def as_guardrail(obj: Any) -> Guardrail:
    """A Guardrail from what users pass to ``with_guardrails``: a decorated function, a
    Guardrail instance, or a Guardrail subclass (made with no arguments)."""
    if isinstance(obj, Guardrail):
        return obj
    if isinstance(obj, type) and issubclass(obj, Guardrail):
        return obj()
    raise ConfigurationError(
        f"{obj!r} is not a guardrail: decorate the function with @input_guardrail, "
        "@output_guardrail or @tool_guardrail (agentloop.guardrails), or pass a Guardrail "
        "subclass."
    )


#: the fix for a guardrail that can't be stored by import path.
_ADVICE = (
    "define the guardrails of persisted chats at module level in an importable module "
    "(e.g. myapp/guardrails.py), so a worker in another process can load them"
)


def guardrail_reference(guardrail: Guardrail) -> str:
    """How a persisted chat names ``guardrail``: the import path of its decorated function,
    or of its Guardrail subclass (made again with no arguments)."""
    what = f"{guardrail.stage} guardrail {guardrail.name!r}"
    if guardrail.function is not None:
        return import_path_of(guardrail, what=what, advice=_ADVICE)
    return import_path_of(type(guardrail), what=what, advice=_ADVICE)


def load_guardrail(path: str) -> Guardrail:
    """The guardrail a :func:`guardrail_reference` names; errors name the path."""
    loaded = load_by_path(path)
    try:
        return as_guardrail(loaded)
    except ConfigurationError:
        raise ConfigurationError(f"{path!r} is not a guardrail.") from None
