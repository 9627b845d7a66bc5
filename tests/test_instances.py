"""The store builds a step's rows and the claimed chat without Django's per-field constructor
calls (``agentloop.django_store.instances``): each instance must be the one Django's own
``Model(**values)`` or ``Model.from_db`` builds, and anything off the plain path must go
through Django's own."""

from __future__ import annotations

import pytest
from django.db.models.signals import post_init, pre_init
from django.test.utils import isolate_apps

from agentloop.django_store.instances import Instances, instances
from agentloop.models import Chat, Message, ToolCall, Usage

pytestmark = pytest.mark.django_db


def state(instance):
    return instance._state.adding, instance._state.db, dict(instance._state.fields_cache)


def same(ours, theirs, *, skip=()):
    assert type(ours) is type(theirs)
    assert {k: v for k, v in ours.__dict__.items() if k not in ("_state", *skip)} == {
        k: v for k, v in theirs.__dict__.items() if k not in ("_state", *skip)
    }
    assert state(ours) == state(theirs)


def test_a_message_row_is_the_instance_django_builds():
    chat = Chat.objects.create(model="test:x")
    values = {
        "chat": chat,
        "role": "assistant",
        "content": "hi",
        "status": "complete",
        "is_error": False,
        "parsed": None,
        "model": "",
        "finish_reason": "stop",
        "thinking": "",
        "provider_data": {"k": 1},
        "attachments": [],
        "guardrails": [],
        "recall": None,
    }
    ours = instances(Message).new(dict(values))
    theirs = Message(**values)
    # created_at is the default's now(): a moment apart.
    same(ours, theirs, skip=("created_at",))
    assert ours.created_at is not None and ours.created_at.tzinfo is not None
    assert ours.chat is chat and ours.chat_id == chat.pk  # the related object, cached


def test_rows_by_key_and_the_primary_key_are_built_alike():
    chat = Chat.objects.create(model="test:x")
    call = {"chat_id": chat.pk, "call_id": "c1", "name": "add", "arguments": {"a": 1}}
    same(instances(ToolCall).new(dict(call)), ToolCall(**call))
    built = instances(ToolCall)
    keyed = built.new({built.pk: 7, **call})
    same(keyed, ToolCall(pk=7, **call))
    usage = {"chat_id": chat.pk, "message": None, "provider": "test", "input_tokens": 3}
    same(instances(Usage).new(dict(usage)), Usage(**usage), skip=("created_at",))


def test_a_claimed_row_is_the_instance_from_db_builds():
    chat = Chat.objects.create(model="test:x", title="t")
    built = instances(Chat)
    row = [getattr(chat, name) for name in built.attnames]
    same(built.from_db("default", row), Chat.from_db("default", built.attnames, row))


def test_unknown_names_and_a_key_given_twice_go_to_django():
    with pytest.raises(TypeError, match="unexpected keyword"):
        instances(ToolCall).new({"nonsense": 1})
    chat = Chat.objects.create(model="test:x")
    ours = instances(Message).new({"chat": chat, "chat_id": chat.pk, "role": "user"})
    assert ours.chat_id == chat.pk


def test_signals_are_sent_as_django_sends_them():
    seen = []

    def before(sender, args, kwargs, **_):
        seen.append(("pre", sender))
        kwargs["name"] = "changed"  # a pre_init receiver may change the arguments

    def after(sender, instance, **_):
        seen.append(("post", sender, instance.name))

    pre_init.connect(before, sender=ToolCall)
    post_init.connect(after, sender=ToolCall)
    try:
        instance = instances(ToolCall).new({"call_id": "c1", "name": "add"})
    finally:
        pre_init.disconnect(before, sender=ToolCall)
        post_init.disconnect(after, sender=ToolCall)
    assert instance.name == "changed"
    assert seen == [("pre", ToolCall), ("post", ToolCall, "changed")]

    post_init.connect(after, sender=ToolCall)
    try:
        instances(ToolCall).new({"call_id": "c2", "name": "plain"})
    finally:
        post_init.disconnect(after, sender=ToolCall)
    assert seen[-1] == ("post", ToolCall, "plain")


@isolate_apps("example_project")
def test_a_model_off_the_plain_path_is_built_by_django():
    # Its own constructor (and a parent model): Django builds it.
    class Counting(Message):
        built = 0

        def __init__(self, *args, **kwargs):
            type(self).built += 1
            super().__init__(*args, **kwargs)

        class Meta:
            app_label = "example_project"

    built = Instances(Counting)
    assert not built.plain
    built.new({"role": "user"})
    assert Counting.built == 1
