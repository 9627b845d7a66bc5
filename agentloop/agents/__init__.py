"""Agents: a chat's configuration as a class, and agents handed to chats as tools.

::

    class Research(agentloop.Agent):
        \"\"\"Researches a question and reports back.\"\"\"
        model = "openai:gpt-4.1-mini"
        instructions = "You research {topic} carefully."
        tools = [WebSearch]
        inputs = ["topic"]

    chat = Research.create(owner=user, topic="Django")     # persisted, configured
    lead.with_tools(Research)                              # a subagent tool named "research"

As a tool, an agent takes ``task`` plus its inputs not bound by ``as_tool(**bound)``,
runs a fresh child chat (linked to the parent chat and the tool call, same owner)
and returns the child's last answer. In a background worker the child runs as its
own jobs while the parent's call waits; the parent resumes when the child settles.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, create_model

from ..conf import agentloop_settings, get_chat_model
from ..engine._transcript_reading import finished, next_move
from ..exceptions import (
    CancelledError,
    ChatStoppedError,
    ConfigurationError,
    ToolError,
    ToolWaiting,
)
from ..import_paths import import_path_of
from ..in_memory import chat as new_chat
from ..tools import Tool, current_tool_context, snake_case
from .handoffs import HandoffTool, follow_in_memory, handoff_tool, handoff_tools, take_over

if TYPE_CHECKING:
    from ..engine import Conversation

__all__ = ["Agent", "AgentTool", "HandoffTool", "last_answer"]

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class Agent:
    """Base class of agents: class attributes configure the chats they make."""

    #: "provider:model" (None: the project's DEFAULT_MODEL).
    model: ClassVar[str | None] = None
    provider: ClassVar[str | None] = None
    #: the system message; ``{name}`` placeholders are filled from the inputs.
    instructions: ClassVar[str] = ""
    #: tools, @tool functions and other agents (as subagents).
    tools: ClassVar[Sequence[Any]] = ()
    #: keyword arguments of ``with_tool_options``.
    tool_options: ClassVar[Mapping[str, Any]] = {}
    temperature: ClassVar[float | None] = None
    #: structured output: a pydantic model or a JSON schema.
    schema: ClassVar[Any] = None
    #: what the agent does, for the model choosing it as a tool (default: the docstring).
    description: ClassVar[str] = ""
    #: named inputs (a list of names, or names -> descriptions), strings given at creation.
    inputs: ClassVar[Sequence[str] | Mapping[str, str]] = ()
    #: keyword arguments of ``with_limits``.
    limits: ClassVar[Mapping[str, Any]] = {}
    #: "provider:model" names tried in order when the model fails for a step (``with_fallbacks``).
    fallbacks: ClassVar[Sequence[str]] = ()
    #: agents the model may hand the conversation over to (classes, import paths, or
    #: ``Other.as_handoff(...)``): each offered as a tool, ``transfer_to_<snake case>``.
    handoffs: ClassVar[Sequence[Any]] = ()
    #: guardrails its chats run (``with_guardrails``; agentloop.guardrails).
    guardrails: ClassVar[Sequence[Any]] = ()
    #: keyword arguments of ``with_memory`` (memories recalled before each model call);
    #: None: the agent sets none.
    memory: ClassVar[Mapping[str, Any] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("description"):
            cls.description = (cls.__doc__ or "").strip()

    # -- configuration ------------------------------------------------------------------
    @classmethod
    def input_names(cls) -> list[str]:
        return list(cls.inputs)

    @classmethod
    def render_instructions(cls, inputs: Mapping[str, Any]) -> str:
        """The instructions with ``{name}`` placeholders of known inputs filled in."""
        missing = [name for name in cls.input_names() if name not in inputs]
        if missing:
            raise ConfigurationError(f"{cls.__name__} needs the input(s) {', '.join(missing)}.")
        unknown = sorted(set(inputs) - set(cls.input_names()))
        if unknown:
            raise ConfigurationError(f"{cls.__name__} has no input(s) {', '.join(unknown)}.")

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            return str(inputs[name]) if name in inputs else match.group(0)

        return _PLACEHOLDER.sub(fill, cls.instructions)

    @classmethod
    def configure(cls, chat: Any, **inputs: Any) -> Any:
        """Apply this agent's configuration to ``chat`` (persisted or in memory)."""
        instructions = cls.render_instructions(inputs)
        if cls.model:
            chat.with_model(cls.model, cls.provider)
        if instructions:
            chat.with_instructions(instructions)
        store = getattr(chat, "conversation", chat).store
        if cls.tools or cls.handoffs or store.config.get_tools():
            # The agent's tools are the chat's: a tool removed from the class goes too.
            chat.with_tools(*cls.tools, *handoff_tools(cls), replace=True)
        if cls.tool_options:
            chat.with_tool_options(**cls.tool_options)
        if cls.temperature is not None:
            chat.with_temperature(cls.temperature)
        if cls.schema is not None:
            chat.with_schema(cls.schema)
        if cls.limits:
            chat.with_limits(**cls.limits)
        if cls.fallbacks:
            chat.with_fallbacks(*cls.fallbacks)
        if cls.guardrails or store.config.get_guardrails():
            # The agent's guardrails are the chat's: one removed from the class goes too.
            chat.with_guardrails(*cls.guardrails, replace=True)
        if cls.memory is not None:
            chat.with_memory(**cls.memory)
        return chat

    @classmethod
    def chat(cls, **inputs: Any) -> Conversation:
        """An in-memory chat configured by this agent."""
        conversation: Conversation = cls.configure(new_chat(cls.model), **inputs)
        store: Any = conversation.store
        store.agent, store.agent_inputs = cls, dict(inputs)
        store.agent_digest, store.agent_name = cls.fingerprint(inputs), cls.__name__
        # Each verb applies the chat's agent as the class is now (attributes changed since,
        # say), whichever agent it was handed to meanwhile.
        conversation.on("claimed", lambda: follow_in_memory(conversation))
        return conversation

    @classmethod
    def create(cls, owner: Any = None, **inputs: Any) -> Any:
        """A persisted chat configured by this agent (its import path and inputs are stored
        too: each verb applies the agent's configuration as the code has it then)."""
        links = ("parent", "parent_tool_call", "parent_tool_call_id")
        extra = {key: inputs.pop(key) for key in links if key in inputs}
        chat = get_chat_model()(
            owner=owner,
            model=cls.model or agentloop_settings.DEFAULT_MODEL,
            provider=cls.provider or "",
            agent_path=import_path_of(cls),
            agent_inputs=inputs,
            title=cls.__name__,
            **extra,
        )
        chat.agent_digest = cls.fingerprint(inputs)  # fails before saving anything
        chat.save()
        return cls.configure(chat, **inputs)

    @classmethod
    def find(cls, pk: Any, **inputs: Any) -> Any:
        """The persisted chat ``pk`` under this agent's configuration from then on: a chat
        made by another agent (or by none) is handed over (a handoff: its ``agent_path``
        is re-recorded). ``inputs`` add to the chat's stored ones.

        Inside a tool of that chat's own run it is the run's chat, handed over with the
        tool's result (``ToolContext.hand_off``): the run's next model call is this agent's."""
        chat_model = get_chat_model()
        path = import_path_of(cls)
        context = current_tool_context()
        running = context.chat if context is not None else None
        if isinstance(running, chat_model) and str(running.pk) == str(pk):
            if running.agent_path != path or inputs:
                kept = cls._inputs_for(running.agent_inputs, inputs)
                cls.fingerprint(kept)  # a missing input raises here, in the tool
                context.hand_off(cls, **inputs)  # type: ignore[union-attr]
            return running
        chat = chat_model.objects.get(pk=pk)
        if chat.agent_path != path or inputs:
            record = cls.take_over(chat, inputs)
            chat.conversation.emit("handed_off", record, None)
        return chat

    @classmethod
    def take_over(cls, chat: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """This agent takes ``chat`` over (persisted, or in memory): see
        :func:`agentloop.agents.handoffs.take_over`. Returns the handoff's record."""
        store = getattr(chat, "conversation", chat).store
        with store.atomic():
            return take_over(cls, chat, inputs)

    @classmethod
    def as_handoff(
        cls, *, name: str | None = None, description: str | None = None, **bound: Any
    ) -> type[HandoffTool]:
        """The tool that hands a chat over to this agent: ``transfer_to_<snake case>``
        unless ``name`` is given; its parameters are the inputs not ``bound``."""
        return handoff_tool(cls, name=name, description=description, bound=bound)

    @classmethod
    def _inputs_for(cls, stored: Mapping[str, Any] | None, given: Mapping[str, Any]) -> dict:
        merged = {**(stored or {}), **given}
        return {name: value for name, value in merged.items() if name in cls.input_names()}

    # -- following the code: a chat takes the agent's configuration as it is now -----------
    @classmethod
    def fingerprint(cls, inputs: Mapping[str, Any]) -> str:
        """A digest of what ``configure(chat, **inputs)`` applies: equal digests, nothing
        to apply (so an unchanged agent costs a verb no query)."""
        applied = {
            "model": cls.model,
            "provider": cls.provider,
            "instructions": cls.render_instructions(inputs),
            "tools": [_stable_name(tool) for tool in cls.tools],
            "tool_options": dict(cls.tool_options),
            "temperature": cls.temperature,
            "schema": None if cls.schema is None else _stable_name(cls.schema),
            "limits": dict(cls.limits),
        }
        if cls.handoffs:  # only then: the digests of agents without any stay as they were
            applied["handoffs"] = [_stable_name(item) for item in cls.handoffs]
        if cls.guardrails:  # only then: the digests of agents without any stay as they were
            applied["guardrails"] = [_stable_name(guardrail) for guardrail in cls.guardrails]
        if cls.memory is not None:  # likewise
            applied["memory"] = dict(cls.memory)
        text = json.dumps(applied, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def follow(cls, chat: Any, inputs: Mapping[str, Any], applied: str) -> str:
        """Apply this agent's configuration to ``chat`` when it changed since the ``applied``
        fingerprint; returns the current one."""
        current = cls.fingerprint(inputs)
        if current != applied:
            cls.configure(chat, **inputs)
        return current

    # -- as a tool ------------------------------------------------------------------------
    @classmethod
    def tool_name(cls) -> str:
        """``research`` for ``Research``."""
        return snake_case(cls.__name__)

    @classmethod
    def as_tool(cls, *, name: str | None = None, **bound: Any) -> type[AgentTool]:
        """This agent as a tool taking ``task`` and the inputs not given in ``bound``."""
        unknown = sorted(set(bound) - set(cls.input_names()))
        if unknown:
            raise ConfigurationError(f"{cls.__name__} has no input(s) {', '.join(unknown)}.")
        descriptions = dict(cls.inputs) if isinstance(cls.inputs, Mapping) else {}
        fields: dict[str, Any] = {
            "task": (
                str,
                Field(description="The task, with everything needed written to stand alone."),
            )
        }
        for input_name in cls.input_names():
            if input_name not in bound:
                fields[input_name] = (str, Field(description=descriptions.get(input_name)))
        params = create_model(f"{cls.__name__}Params", **fields)
        attrs: dict[str, Any] = {
            "name": name or cls.tool_name(),
            "description": cls.description or f"Hands a task to the {cls.__name__} agent.",
            "Params": params,
            "agent_class": cls,
            "bound_inputs": dict(bound),
            "__module__": cls.__module__,
        }
        return type(f"{cls.__name__}Tool", (AgentTool,), attrs)


class AgentTool(Tool):
    """The tool an agent becomes: runs a child chat on the task."""

    agent_class: ClassVar[type[Agent]]
    bound_inputs: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.transactional:
            raise ConfigurationError(
                f"Tool {cls.__qualname__}: an agent's tool runs a chat of its own (its own "
                "leases, rows and jobs), which can't be part of its parent's transaction: "
                "it can't be transactional"
            )

    @classmethod
    def default_name(cls, prefix: str = "") -> str:
        """``research`` (``billing_research`` with the prefix ``billing``)."""
        name = cls.agent_class.tool_name()
        return f"{prefix}_{name}" if prefix else name

    @classmethod
    def renamed(cls, name: str) -> type[AgentTool]:
        """The same agent tool under another name."""
        return cls.agent_class.as_tool(name=name, **cls.bound_inputs)

    @classmethod
    def reference(cls) -> str:
        """How a persisted chat names this tool: ``agent:<path>`` (+ bound inputs, name)."""
        extra = dict(cls.bound_inputs)
        if cls.name != cls.agent_class.tool_name():
            extra["__name__"] = cls.name
        suffix = "?" + json.dumps(extra, sort_keys=True) if extra else ""
        return f"agent:{import_path_of(cls.agent_class)}{suffix}"

    def execute(self, *args: Any, task: str = "", **inputs: Any) -> str:
        agent = type(self).agent_class
        inputs = {**type(self).bound_inputs, **inputs}
        parent = self.context.chat
        if not hasattr(parent, "_meta"):
            return self._run_in_memory(agent, task, inputs)
        child = self._child(parent, agent, task, inputs)
        if self.context.background:
            # The child runs as its own jobs; our call waits and is settled when it ends.
            if next_move(child.conversation.messages) == "done":
                return last_answer(child)
            start = None if child.state in ("queued", "running") else child.complete_later
            raise ToolWaiting("subagent", then=start)
        try:
            child.complete()
        except CancelledError as exc:
            raise ToolError(f"The {agent.__name__} subagent's run was cancelled.") from exc
        except ChatStoppedError as exc:  # a limit, a guardrail's block: the model is told
            raise ToolError(f"The {agent.__name__} subagent stopped: {exc.reason}") from exc
        if child.conversation.is_complete():
            return last_answer(child)
        raise ToolWaiting("subagent")  # the child waits for a person; so do we

    def _child(self, parent: Any, agent: type[Agent], task: str, inputs: dict[str, Any]) -> Any:
        """The child chat of this call: the existing one (after a crash or a wait) or a new
        one, asked the task."""
        call = self.tool_call
        child = type(parent)._default_manager.filter(parent_tool_call_id=call.key).first()
        if child is None:
            child = agent.create(
                owner=parent.owner, parent=parent, parent_tool_call_id=call.key, **inputs
            )
        if not any(m.role == "user" for m in child.conversation.messages):
            child.ask_later(task)
        return child

    def _run_in_memory(self, agent: type[Agent], task: str, inputs: dict[str, Any]) -> str:
        child = agent.chat(**inputs)
        answer = child.ask(task)
        if child.is_waiting():
            raise ToolError(
                f"The {agent.__name__} agent needs a person's input, which an in-memory chat "
                "can't wait for; use a persisted Chat."
            )
        return str(getattr(answer, "content", "") or "")


def last_answer(child: Any) -> str:
    """A child chat's latest answer as its parent's tool result (structured output as JSON)."""
    for message in reversed(finished(child.conversation.messages)):
        if message.role == "assistant":
            if message.parsed is not None:
                return json.dumps(message.parsed)
            return message.content
    return ""


def _stable_name(obj: Any) -> str:
    """A stable name for a tool, an agent or a schema (it need not be importable)."""
    bound = getattr(obj, "bound_inputs", None)
    agent = getattr(obj, "agent_class", None)
    if agent is not None:
        return (
            f"{_stable_name(agent)}:{getattr(obj, 'name', '')}:{json.dumps(bound, sort_keys=True)}"
        )
    if isinstance(obj, type) or callable(obj):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    return json.dumps(obj, sort_keys=True, default=str)
