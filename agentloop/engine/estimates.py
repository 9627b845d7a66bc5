"""What a model call is counted for before it answers: its input at about four characters a
token, its output at the request's ``max_output_tokens`` (else ``ESTIMATED_OUTPUT_TOKENS``),
and the price of both from the provider (None when the provider doesn't know the model's).

Budgets reserve the estimate's cost and tokens (the usage row then settles them to the
exact figures); the tokens-per-minute buckets take its tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal

from ..conf import agentloop_settings
from ..messages import ModelRequest, TokenUsage, checked_cost
from ..providers.base import Provider
from .compaction import estimate_tokens

__all__ = ["CallEstimate", "estimate_call"]


@dataclass(frozen=True)
class CallEstimate:
    """A model call as counted before it answers."""

    #: the name the provider is registered under, and the model id.
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    #: the price of the estimate; None when the provider doesn't know the model's prices.
    cost: Decimal | None

    def __post_init__(self) -> None:
        # What a budget reserves: a provider's price is checked as a usage row's is.
        object.__setattr__(self, "cost", checked_cost(self.cost, self.model))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def estimate_call(provider: Provider, provider_name: str, request: ModelRequest) -> CallEstimate:
    """The estimate of ``request`` to ``provider`` (registered as ``provider_name``)."""
    tools = sum(
        len(tool.name) + len(tool.description) + len(json.dumps(tool.parameters, default=str))
        for tool in request.tools
    )
    input_tokens = estimate_tokens(request.messages) + tools // 4
    output_tokens = request.max_output_tokens or agentloop_settings.ESTIMATED_OUTPUT_TOKENS
    usage = TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    return CallEstimate(
        provider=provider_name,
        model=request.model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=provider.cost(request.model, usage),
    )
