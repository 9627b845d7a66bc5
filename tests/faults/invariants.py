"""What must hold after any fault (DESIGN §19), checked from the rows and the tools' run log.

* every chat completes: idle, no lease, nothing left to do;
* no message lost or duplicated: the user messages are the ones sent, one finished answer per
  round of the rule, one tool message per call, in order;
* every tool call has at most one result, and a finished call exactly one;
* a non-idempotent tool ran at most once per call (across every process).

A fault may leave extra rows that say what it cut: an assistant message ``partial``,
``failed`` or ``cancelled`` (a stream cut mid-way), which the model is never shown again.
They are allowed; a second *complete* copy of anything is not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, ChatState
from tests.faults.tools import NOT_IDEMPOTENT

_CUT = {MessageStatus.PARTIAL, MessageStatus.FAILED, MessageStatus.CANCELLED}


@dataclass(frozen=True)
class Sent:
    """A chat and the rule (tests/worker_provider.py) of the one message sent to it."""

    chat_pk: int
    rule: str

    @property
    def rounds(self) -> list[list[str]]:
        kind, _, spec = self.rule.split(" ", 1)[0].partition(":")
        if kind != "tools":
            return []
        return [[name for name in group.split(",") if name] for group in spec.split("|")]


def settled(chat: Chat) -> bool:
    """Idle with no lease and nothing left to do (re-read from the database)."""
    chat.refresh_from_db()
    return chat.state == ChatState.IDLE and not chat.lease_token and chat.is_complete()


def runs(run_log: Path) -> list[tuple[int, str, int, str]]:
    """(chat pk, call id, pid, tool name) per logged run (tests/faults/tools.py)."""
    if not run_log.exists():
        return []
    found = []
    for line in run_log.read_text().splitlines():
        chat, call, pid, name = line.split()
        found.append((int(chat), call, int(pid), name))
    return found


def problems(sent: list[Sent], run_log: Path) -> list[str]:
    """Every broken invariant, one line each (empty when all hold)."""
    found: list[str] = []
    logged = runs(run_log)
    for item in sent:
        chat = Chat.objects.get(pk=item.chat_pk)
        where = f"chat {chat.pk} ({item.rule})"
        if not settled(chat):
            found.append(f"{where}: not complete (state {chat.state}, lease {chat.lease_token!r})")
        messages = list(chat.messages.select_related("tool_call").order_by("id"))
        users = [m.content for m in messages if m.role == "user"]
        if users != [item.rule]:
            found.append(f"{where}: user messages {users!r}, sent [{item.rule!r}]")
        finished = [m for m in messages if m.status not in _CUT]
        cut = [m for m in messages if m.status in _CUT and m.role != "assistant"]
        if cut:
            found.append(f"{where}: cut rows that aren't answers: {[m.pk for m in cut]}")
        expected = ["user"]
        for group in item.rounds:
            expected += ["assistant"] + ["tool"] * len(group)
        expected.append("assistant")
        shape = [m.role for m in finished]
        if shape != expected:
            found.append(f"{where}: finished messages {shape}, expected {expected}")
        calls = list(chat.tool_calls.order_by("id"))
        names = [call.name for call in calls]
        if names != [name for group in item.rounds for name in group]:
            found.append(f"{where}: tool calls {names}, expected {item.rounds}")
        ids = Counter(call.call_id for call in calls)
        found += [f"{where}: call id {cid} stored {n} times" for cid, n in ids.items() if n > 1]
        results = Counter(m.tool_call_id for m in messages if m.role == "tool")
        for call in calls:
            count = results.get(call.pk, 0)
            final = call.state in (ToolCallState.SUCCEEDED, ToolCallState.FAILED)
            if count > 1 or (final and count != 1) or (not final and count):
                found.append(f"{where}: call {call.call_id} ({call.state}) has {count} results")
        chat_runs = Counter((call, name) for pk, call, _, name in logged if pk == chat.pk)
        for (call, name), count in chat_runs.items():
            if name in NOT_IDEMPOTENT and count > 1:
                found.append(f"{where}: non-idempotent {name} (call {call}) ran {count} times")
    return found


def assert_invariants(sent: list[Sent], run_log: Path, context: Any = "") -> None:
    broken = problems(sent, run_log)
    assert not broken, "invariants broken:\n" + "\n".join(broken) + f"\n{context}"
