"""What the eval tests replay with: a tool that notes every real run, a model for worker
processes that logs each request's user message, and a scoring function."""

from __future__ import annotations

import json
import os
import re
import time
from decimal import Decimal
from pathlib import Path

from agentloop.evals import Outcome
from agentloop.messages import ModelRequest, ModelResponse, TokenUsage, ToolCall
from agentloop.providers import ChunkCallback, Provider
from agentloop.tools import tool

#: the orders `lookup_order` looked up in this process (a run of its body, for real).
LOOKED_UP: list[str] = []


@tool
def lookup_order(order: str) -> str:
    """Looks an order up."""
    LOOKED_UP.append(order)
    path = os.environ.get("AGENTLOOP_TEST_RUN_LOG")
    if path:
        with Path(path).open("a") as log:
            log.write(f"lookup_order:{order}\n")
    return f"order {order}: shipped"


def says_shipped(outcome: Outcome) -> tuple[float, str]:
    """A scoring function: 1 when the answer says "shipped"."""
    return (1.0, "says shipped") if "shipped" in outcome.answer else (0.0, "no 'shipped'")


class EvalModel(Provider):
    """Answers in any process by the latest user message: ``order N`` calls
    ``lookup_order(order="N")`` once and then answers ``"Order N: <result>"``; ``sleep=S``
    in the message waits S seconds first; anything else gets ``"answer: <message>"``. Each
    request's user message goes to ``$AGENTLOOP_TEST_PROVIDER_LOG`` (one JSON line)."""

    name = "evalmodel"

    def __init__(self, name: str = "evalmodel") -> None:
        self.name = name

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        last = max(i for i, m in enumerate(request.messages) if m.role == "user")
        message = request.messages[last].content
        after = request.messages[last + 1 :]
        path = os.environ.get("AGENTLOOP_TEST_PROVIDER_LOG")
        if path:
            with Path(path).open("a") as log:
                log.write(json.dumps({"message": message, "pid": os.getpid()}) + "\n")
        sleep = re.search(r"sleep=([0-9.]+)", message)
        if sleep and not after:
            time.sleep(float(sleep.group(1)))
        usage = TokenUsage(input_tokens=10, output_tokens=5)
        order = re.search(r"order (\w+)", message)
        if order and not after and "lookup_order" in {t.name for t in request.tools}:
            call = ToolCall(id=f"call_{order.group(1)}", name="lookup_order",
                            arguments={"order": order.group(1)})  # fmt: skip
            return ModelResponse(content="", tool_calls=[call], usage=usage, model=request.model)
        results = [m.content for m in after if m.role == "tool"]
        text = (
            f"Order {order.group(1)}: {results[-1]}" if order and results else f"answer: {message}"
        )
        return ModelResponse(content=text, usage=usage, model=request.model)

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """Every token at $0.001, so evals have a cost to count."""
        return Decimal("0.001") * (usage.input_tokens + usage.output_tokens)
