"""Guardrails for tests, importable by path so persisted chats (and worker processes) can
load them. They key off the text they judge, so the ``rules`` provider's chats (its answer
echoes the message) and scripted chats can both use them."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from agentloop.guardrails import (
    PASS,
    Block,
    Decision,
    Guardrail,
    GuardrailContext,
    Replace,
    input_guardrail,
    output_guardrail,
    tool_guardrail,
)

CARD = re.compile(r"\b\d{4}(?: ?\d{4}){3}\b")

#: what each guardrail saw, in order ("<name>:<text>"), for the in-process tests.
SEEN: list[str] = []
_lock = threading.Lock()


def _saw(context: GuardrailContext) -> None:
    with _lock:
        SEEN.append(f"{context.guardrail}:{context.text}")


@input_guardrail
def no_secrets(context: GuardrailContext) -> Decision:
    """Blocks a message that mentions a secret."""
    _saw(context)
    if "secret" in context.text.lower():
        return Block("the message mentions a secret")
    return PASS


@input_guardrail
async def redact_cards(context: GuardrailContext) -> Decision:
    """Replaces card numbers (an ``async def`` guardrail)."""
    await asyncio.sleep(0)
    _saw(context)
    if CARD.search(context.text):
        return Replace(text=CARD.sub("[card]", context.text))
    return PASS


@input_guardrail
def forget_cards(context: GuardrailContext) -> Decision:
    """Replaces card numbers and keeps no copy of them (a redaction)."""
    if CARD.search(context.text):
        return Replace(text=CARD.sub("[card]", context.text), keep_original=False)
    return PASS


@input_guardrail
def explodes(context: GuardrailContext) -> Decision:
    """Raises on a message saying "boom"."""
    if "boom" in context.text:
        raise RuntimeError("the moderation service is down")
    return PASS


@input_guardrail
def forgets_to_decide(context: GuardrailContext) -> Any:
    """A guardrail bug: returns nothing (it must fail closed)."""
    _saw(context)
    return None


#: the parallel guardrails wait for this before deciding (a test sets it once the model
#: call is in flight); None: decide at once.
RELEASE: threading.Event | None = None


@input_guardrail(run_in_parallel=True)
def slow_moderation(context: GuardrailContext) -> Decision:
    """Runs while the model call is in flight; blocks "forbidden" messages."""
    if RELEASE is not None:
        RELEASE.wait(30)
    _saw(context)
    if "forbidden" in context.text:
        return Block("moderation flagged the message")
    if CARD.search(context.text):
        return Replace(text=CARD.sub("[card]", context.text))
    return PASS


@input_guardrail(run_in_parallel=True)
async def async_moderation(context: GuardrailContext) -> Decision:
    """``slow_moderation`` as an ``async def`` guardrail (waits without a thread)."""
    while RELEASE is not None and not RELEASE.is_set():
        await asyncio.sleep(0.01)
    _saw(context)
    if "forbidden" in context.text:
        return Block("moderation flagged the message")
    return PASS


@input_guardrail(run_in_parallel=True)
def timed_moderation(context: GuardrailContext) -> Decision:
    """Blocks "forbidden" messages a little after the call started (for worker processes,
    where no test can hand it an event)."""
    threading.Event().wait(0.5)
    if "forbidden" in context.text:
        return Block("moderation flagged the message")
    return PASS


@output_guardrail
def no_leaks(context: GuardrailContext) -> Decision:
    """Blocks an answer that leaks."""
    _saw(context)
    if "LEAK" in context.text:
        return Block("the answer leaks internal data")
    return PASS


@output_guardrail
def polite(context: GuardrailContext) -> Decision:
    """Replaces rude words in an answer."""
    if "damn" in context.text:
        return Replace(text=context.text.replace("damn", "darn"))
    return PASS


@output_guardrail
async def explodes_on_answers(context: GuardrailContext) -> Decision:
    """Raises on an answer saying "boom"."""
    if "boom" in context.text:
        raise ValueError("the classifier timed out")
    return PASS


@tool_guardrail(tools=["charge_card", "charge_card_slowly"])
def cap_charges(context: GuardrailContext) -> Decision:
    """Blocks charges over 40 (the model sees why and goes on)."""
    assert context.tool_call is not None
    _saw(context)
    if context.tool_call.arguments.get("amount", 0) > 40:
        return Block("charges over 40 need a person")
    return PASS


@tool_guardrail(tools=["charge_card"])
def stop_charges(context: GuardrailContext) -> Decision:
    """Blocks every charge and stops the chat."""
    return Block("charging is switched off", stop=True)


@tool_guardrail(tools=["add"])
def tenfold(context: GuardrailContext) -> Decision:
    """Replaces ``a`` by ten times ``a`` (arguments rewritten before the tool runs)."""
    assert context.tool_call is not None
    arguments = dict(context.tool_call.arguments)
    arguments["a"] = int(arguments["a"]) * 10
    return Replace(arguments=arguments)


@tool_guardrail(tools=["add"])
def breaks_arguments(context: GuardrailContext) -> Decision:
    """Replaces the arguments with ones the tool refuses (a guardrail bug)."""
    return Replace(arguments={"a": "not a number"})


class NoShouting(Guardrail):
    """A Guardrail subclass: blocks answers in capitals (stored by its class path)."""

    stage = "output"

    def check(self, context: GuardrailContext) -> Decision:
        letters = [c for c in context.text if c.isalpha()]
        if letters and all(c.isupper() for c in letters):
            return Block("the answer shouts")
        return PASS


def seen() -> list[str]:
    with _lock:
        return list(SEEN)


def forget() -> None:
    with _lock:
        SEEN.clear()


@tool_guardrail(tools=["transfer", "ask_accounting"])
def no_offshore(context: GuardrailContext) -> Decision:
    """Blocks transfers to "offshore" and accounting questions about invoice INV-0."""
    assert context.tool_call is not None
    arguments = context.tool_call.arguments
    if arguments.get("to") == "offshore" or arguments.get("invoice") == "INV-0":
        return Block("not to that account")
    return PASS


# -- answers that call tools, time limits and cancels (tests/test_guardrail_limits.py) ---------
@output_guardrail
def no_launch_codes(context: GuardrailContext) -> Decision:
    """Blocks an answer that gives a secret away, whether or not it also calls a tool."""
    _saw(context)
    if "SECRET" in context.text:
        return Block("the answer gives a secret away")
    return PASS


@output_guardrail
def hide_codes(context: GuardrailContext) -> Decision:
    """Replaces four-digit codes in an answer's text."""
    if re.search(r"\b\d{4}\b", context.text):
        return Replace(text=re.sub(r"\b\d{4}\b", "[code]", context.text))
    return PASS


class Holds:
    """What the holding guardrails below wait for and report: ``release`` (a test sets it
    once the run ended, so that their threads end too), ``entered`` (one started),
    ``returned`` (one returned its decision), ``cancelled`` (the async ones whose task was
    cancelled). Each test gets fresh ones (``release_holds``): a thread a test left behind
    reports to its own test's."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()
        self.cancelled: list[str] = []


HOLDS = Holds()


def _hold(context: GuardrailContext) -> Decision:
    holds = HOLDS
    _saw(context)
    holds.entered.set()
    holds.release.wait(60)
    holds.returned.set()
    return PASS


@input_guardrail(timeout=0.2)
def stalls(context: GuardrailContext) -> Decision:
    """Holds well past its own time limit (0.2 s)."""
    return _hold(context)


@input_guardrail
def stalls_under_the_setting(context: GuardrailContext) -> Decision:
    """Holds with no time limit of its own (``AGENTLOOP["GUARDRAIL_TIMEOUT"]`` bounds it)."""
    return _hold(context)


@input_guardrail(timeout=120)
def holds_input(context: GuardrailContext) -> Decision:
    """Holds a user message (until ``HOLDS.release``, or a minute); a cancel comes first."""
    return _hold(context)


@output_guardrail(timeout=120)
def holds_output(context: GuardrailContext) -> Decision:
    """Holds an answer; a cancel comes first."""
    return _hold(context)


@tool_guardrail(timeout=120)
def holds_tool_calls(context: GuardrailContext) -> Decision:
    """Holds a tool call; a cancel comes first."""
    return _hold(context)


@output_guardrail(timeout=0.2)
async def stalls_async(context: GuardrailContext) -> Decision:
    """An ``async def`` guardrail holding past its time limit (its task is cancelled)."""
    holds = HOLDS
    holds.entered.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        holds.cancelled.append(context.guardrail)
        raise
    holds.returned.set()
    return PASS


@input_guardrail(timeout=120)
def holds_for_the_flag(context: GuardrailContext) -> Decision:
    """In a worker process: logs that it started, holds until $AGENTLOOP_TEST_FLAG exists (at
    most 2 minutes, as the held tools do), then logs that it returned."""
    _log_guardrail("holds_for_the_flag:started")
    flag = os.environ.get("AGENTLOOP_TEST_FLAG")
    deadline = time.monotonic() + 120
    while flag and not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    _log_guardrail("holds_for_the_flag:returned")
    return PASS


def _log_guardrail(line: str) -> None:
    """Append to $AGENTLOOP_TEST_RUN_LOG (the run log the tools of tests/tools.py write)."""
    path = os.environ.get("AGENTLOOP_TEST_RUN_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


def release_holds() -> None:
    """Let held guardrails return, and give the next test fresh ``HOLDS``."""
    global HOLDS
    HOLDS.release.set()
    HOLDS = Holds()


@tool_guardrail(tools=["transfer"])
def round_down(context: GuardrailContext) -> Decision:
    """Rounds a transfer's amount down to a multiple of ten (it counts its calls in SEEN)."""
    assert context.tool_call is not None
    _saw(context)
    amount = int(context.tool_call.arguments.get("amount", 0))
    if amount % 10:
        return Replace(arguments={**context.tool_call.arguments, "amount": amount - amount % 10})
    return PASS


@input_guardrail(run_in_parallel=True, timeout=120)
def holds_in_parallel(context: GuardrailContext) -> Decision:
    """Holds while the model call is in flight and after its answer came; a cancel comes
    first."""
    return _hold(context)
