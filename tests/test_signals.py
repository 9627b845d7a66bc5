"""Django signals mirror the engine's callbacks for persisted chats, sent with
``sender`` = the chat model class and ``chat`` = the instance."""

from __future__ import annotations

import pytest

from agentloop import CancelledError, LimitReachedError, signals
from agentloop.models import Chat, Message, ToolCall
from agentloop.testing import tool_call
from tests.tools import add

pytestmark = pytest.mark.django_db

SIGNALS = {
    "model_call_started": signals.model_call_started,
    "message_added": signals.message_added,
    "tool_call_started": signals.tool_call_started,
    "tool_call_finished": signals.tool_call_finished,
    "chat_cancelled": signals.chat_cancelled,
    "chat_stopped": signals.chat_stopped,
}


@pytest.fixture
def received():
    """Every signal sent for the Chat model: (name, sender, kwargs without ``signal``)."""
    events = []
    receivers = {}
    for name, signal in SIGNALS.items():

        def receiver(sender, name=name, **kwargs):
            kwargs.pop("signal")
            events.append((name, sender, kwargs))

        receivers[name] = receiver
        signal.connect(receiver, sender=Chat, weak=False)
    yield events
    for name, signal in SIGNALS.items():
        signal.disconnect(receivers[name], sender=Chat)


def describe(kwargs):
    """The kwargs other than ``chat``, as comparable values."""
    out = {}
    for key, value in kwargs.items():
        if key == "chat":
            continue
        if isinstance(value, Message):
            out[key] = (value.role, value.content)
        elif isinstance(value, ToolCall):
            out[key] = (value.call_id, value.name, value.arguments)
        else:
            out[key] = value
    return out


@pytest.fixture
def chat(user):
    return Chat.objects.create(model="scripted:test", owner=user).with_tools(add)


def test_a_tool_conversation_sends_each_signal_in_order_with_its_kwargs(chat, scripted, received):
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="c1"), "It is 3.")

    chat.ask("1 + 2?")

    assert [(name, describe(kwargs)) for name, _, kwargs in received] == [
        ("message_added", {"message": ("user", "1 + 2?")}),
        ("model_call_started", {}),
        ("message_added", {"message": ("assistant", "")}),
        ("tool_call_started", {"tool_call": ("c1", "add", {"a": 1, "b": 2})}),
        ("tool_call_finished", {"message": ("tool", "3")}),
        ("message_added", {"message": ("tool", "3")}),
        ("model_call_started", {}),
        ("message_added", {"message": ("assistant", "It is 3.")}),
    ]
    assert {sender for _, sender, _ in received} == {Chat}
    assert all(kwargs["chat"] is chat for _, _, kwargs in received)


def test_signals_carry_the_saved_rows(chat, scripted, received):
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="c1"), "It is 3.")

    chat.ask("1 + 2?")

    saved = [kwargs["message"].pk for name, _, kwargs in received if name == "message_added"]
    assert saved == list(chat.messages.values_list("pk", flat=True))
    (started,) = [
        kwargs["tool_call"] for name, _, kwargs in received if name == "tool_call_started"
    ]
    assert started.pk == ToolCall.objects.get(call_id="c1").pk
    (finished,) = [
        kwargs["message"] for name, _, kwargs in received if name == "tool_call_finished"
    ]
    assert finished.tool_call_id == started.pk


def test_a_fresh_instance_sends_signals_too(chat, scripted, received):
    scripted.add("Hi")
    loaded = Chat.objects.get(pk=chat.pk)

    loaded.ask("Hello")

    assert [name for name, _, _ in received] == [
        "message_added",
        "model_call_started",
        "message_added",
    ]
    assert all(kwargs["chat"] is loaded for _, _, kwargs in received)


def test_a_cancelled_run_sends_chat_cancelled(chat, scripted, received):
    chat.ask_later("Hello")
    received.clear()
    chat.before_message(lambda: Chat.objects.get(pk=chat.pk).cancel())

    with pytest.raises(CancelledError):
        chat.step()

    assert [(name, sender, kwargs) for name, sender, kwargs in received] == [
        ("model_call_started", Chat, {"chat": chat}),
        ("chat_cancelled", Chat, {"chat": chat}),
    ]


def test_a_limit_sends_chat_stopped_with_the_reason(chat, scripted, received):
    chat.with_limits(max_model_calls=1)
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="c1"), "never sent")

    with pytest.raises(LimitReachedError):
        chat.ask("1 + 2?")

    stopped = [(sender, kwargs) for name, sender, kwargs in received if name == "chat_stopped"]
    assert stopped == [(Chat, {"chat": chat, "reason": "max_model_calls reached (1 of 1)"})]
    assert [name for name, _, _ in received][-1] == "chat_stopped"
    assert len(scripted.requests) == 1


def test_a_receiver_for_another_sender_gets_nothing(chat, scripted):
    heard = []

    def receiver(sender, **kwargs):
        heard.append(sender)

    signals.message_added.connect(receiver, sender=Message, weak=False)
    try:
        scripted.add("Hi")
        chat.ask("Hello")
    finally:
        signals.message_added.disconnect(receiver, sender=Message)

    assert heard == []


def test_a_chat_wires_no_callback_per_event_or_per_step(chat, scripted, monkeypatch):
    """The signals, live events and subagent hooks come from the chat's one listener:
    loading a chat and running a turn with tools registers no callback at all."""
    from agentloop.engine._runs import Callbacks  # the engine's private event registry

    registered: list[str] = []
    original = Callbacks.add
    monkeypatch.setattr(
        Callbacks,
        "add",
        lambda self, event, cb: (registered.append(event), original(self, event, cb)),
    )
    scripted.add(tool_call("add", {"a": 1, "b": 2}), "3")
    fresh = Chat.objects.get(pk=chat.pk)
    assert fresh.ask("1 + 2?").content == "3"
    assert registered == []
    # ... while a callback given by hand is still heard, after the listener's signals.
    heard: list[str] = []
    fresh.after_message(lambda message: heard.append(message.role))
    scripted.add("4")
    fresh.ask("2 + 2?")
    assert registered == ["after_message"] and heard == ["user", "assistant"]
