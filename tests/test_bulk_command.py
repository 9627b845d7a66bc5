"""``manage.py agentloop chats [FILTERS] ACTION``: the filters select chats, the action is the
set-based verb, ``--dry-run`` changes nothing, and bad input is one clear line."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from agentloop.models import Chat, ChatState
from agentloop.runners import wait_for_embedded_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def chats(*arguments: str) -> str:
    out = StringIO()
    call_command("agentloop", "chats", *arguments, stdout=out)
    return out.getvalue()


def make(model: str = "anthropic:claude-sonnet-4", **fields) -> Chat:
    return Chat.objects.create(model=model, **fields)


def halted() -> list[int]:
    return sorted(Chat.objects.exclude(halt_reason="").values_list("pk", flat=True))


def test_the_issue_s_example_halts_the_running_chats_on_a_provider():
    running = make(state=ChatState.RUNNING)
    make(state=ChatState.QUEUED)  # not --state running
    make(model="openai:gpt-4.1", state=ChatState.RUNNING)  # another provider

    out = chats("--model", "anthropic:*", "--state", "running", "halt", "provider outage")

    assert out == "halt: 1 matched, 1 changed, 0 skipped (no run to halt).\n"
    assert halted() == [running.pk]
    assert Chat.objects.get(pk=running.pk).halt_reason == "provider outage"


def test_dry_run_prints_the_counts_and_changes_nothing():
    make(state=ChatState.RUNNING)
    make(state=ChatState.IDLE)

    before = chats("--model", "anthropic:*", "--dry-run", "halt", "outage")
    after = chats("--model", "anthropic:*", "halt", "outage", "--dry-run")  # either place

    expected = (
        "Dry run: halt would change 1 of 2 matching chat(s); 1 skipped (no run to halt). "
        "Nothing changed.\n"
    )
    assert before == after == expected
    assert halted() == []


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--model", "anthropic:*"], [0, 1]),
        (["--model", "*-4.1"], [2]),
        (["--model", "anthropic:claude-?onnet-4"], [0, 1]),
        (["--state", "queued,running"], [0, 2]),
        (["--state", "queued", "--state", "waiting"], [0, 3]),
        (["--owner", "ada"], [1]),
        (["--older-than", "2h"], [3]),
        (["--inactive-for", "30m"], [3]),
        (["--id", "ID2", "--id", "ID3"], [2, 3]),
    ],
)
def test_the_filters(user, arguments, expected):
    made = [
        make(state=ChatState.QUEUED),
        make(owner=user),
        make(model="openai:gpt-4.1", state=ChatState.RUNNING),
        make(model="", state=ChatState.WAITING),
    ]
    long_ago = timezone.now() - timedelta(hours=3)
    Chat.objects.filter(pk=made[3].pk).update(created_at=long_ago, updated_at=long_ago)
    ids = {f"ID{index}": str(chat.pk) for index, chat in enumerate(made)}
    arguments = [ids.get(argument, argument) for argument in arguments]

    out = chats(*arguments, "list")

    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert sorted(listed) == sorted(f"#{made[index].pk}" for index in expected)


@override_settings(AGENTLOOP={"DEFAULT_MODEL": "openai:gpt-4.1-mini"})
def test_a_chat_on_the_default_model_matches_the_default_model_s_glob():
    default = make(model="")
    make(model="anthropic:claude")
    out = chats("--model", "openai:*", "list")
    assert out.splitlines()[0] == "1 matching chat(s):"
    assert f"#{default.pk} idle (default model)" in out


def test_a_provider_stored_apart_from_the_model_matches_provider_globs():
    apart = make(model="claude-sonnet-4", provider="anthropic")
    assert f"#{apart.pk} " in chats("--model", "anthropic:*", "list")


def test_cancel_resume_and_complete_later(scripted):
    running = make(state=ChatState.RUNNING)
    stopped = make(model="scripted:test").ask_later("Hi")
    Chat.objects.filter(pk=stopped.pk).update(state=ChatState.STOPPED, stop_reason="halted: x")
    scripted.add("Back.")

    assert chats("--state", "running", "cancel") == (
        "cancel: 1 matched, 1 changed, 0 skipped (no run to cancel); 0 subagents flagged; "
        "0 waiting chats cancelled.\n"
    )
    assert Chat.objects.get(pk=running.pk).cancel_requested_at is not None
    assert chats("resume") == (
        "resume: 2 matched, 1 changed, 1 skipped (not stopped or failed, or running).\n"
    )
    wait_for_embedded_jobs()
    assert Chat.objects.get(pk=stopped.pk).state == ChatState.IDLE
    assert chats("--id", str(stopped.pk), "complete-later").startswith("complete_later: 1 matched")


def test_with_model_switches_the_chats_not_running():
    idle = make()
    running = make(state=ChatState.RUNNING)
    out = chats("--model", "anthropic:*", "with-model", "openai:gpt-4.1-mini")
    assert out == "with_model: 2 matched, 1 changed, 1 skipped (running).\n"
    assert Chat.objects.get(pk=idle.pk).model == "openai:gpt-4.1-mini"
    assert Chat.objects.get(pk=running.pk).model == "anthropic:claude-sonnet-4"


def test_with_model_of_an_unknown_provider_is_refused_with_nothing_changed():
    make()
    with pytest.raises(CommandError, match=r"^Nothing changed: .*nowhere"):
        chats("with-model", "nowhere:model")
    assert Chat.objects.get().model == "anthropic:claude-sonnet-4"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--state", "sleeping", "list"], "unknown state sleeping: choose from idle, queued"),
        (["--older-than", "3 days", "list"], "'3 days' is not a duration"),
        (["--batch-size", "0", "cancel"], "'0' is not a positive number of chats"),
        (["--owner", "nobody", "cancel"], "No user 'nobody'."),
        (["halt"], "the following arguments are required: reason"),
        (["explode"], "invalid choice: 'explode'"),
    ],
)
def test_bad_input_is_one_clear_line_and_changes_nothing(arguments, message):
    make(state=ChatState.RUNNING)
    with pytest.raises(CommandError, match=message):
        chats(*arguments)
    assert halted() == []
    assert Chat.objects.get().cancel_requested_at is None


def test_list_escapes_model_text_for_the_terminal():
    make(model="evil\x1b[2Jmodel", title="t\x1b]0;x\x07")
    out = chats("list")
    assert "\x1b" not in out
    assert "evil\\x1b[2Jmodel" in out


def test_batch_size_is_passed_on():
    for _ in range(5):
        make(state=ChatState.QUEUED)
    assert chats("--batch-size", "2", "halt", "outage").startswith("halt: 5 matched, 5 changed")
    assert len(halted()) == 5
