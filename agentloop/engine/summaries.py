"""The compaction call: deciding that a request is too big for the context window, asking a
model for the summary, and saving it with its usage row (``ModelCalls`` asks for it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import providers
from ..conf import agentloop_settings
from ..messages import Message, ModelRequest, ModelResponse
from ..providers.base import Provider
from ..providers.catalog import lookup
from . import compaction
from .admission import Admission
from .chat_config import ChatConfig
from .drivers import drive
from .effects import Send
from .retries import retry_delay
from .sending import send
from .store import ChatStore, UsageRecord

__all__ = ["Summaries", "failed_usage"]


def failed_usage(
    provider_name: str, model_id: str, error: BaseException, started: float
) -> UsageRecord:
    """The usage row of an attempt that failed with ``error`` (``started``: its monotonic start)."""
    return UsageRecord(
        provider=provider_name,
        model=model_id,
        status="failed",
        error=f"{type(error).__name__}: {error}",
        duration_ms=int((time.monotonic() - started) * 1000),
    )


class Summaries:
    """Compaction before a model call, and after a provider's context-length error."""

    def __init__(
        self, store: ChatStore, emit: Callable[..., None], admission: Admission | None = None
    ) -> None:
        self.store = store
        self._emit = emit
        #: paces the summary calls and holds them to the chat's budgets, as the others.
        self.admission = admission or Admission(store, emit)

    def _context_window(self, config: ChatConfig, model_id: str) -> int | None:
        if config.context_window is not None:
            return config.context_window
        info = lookup(model_id)
        return info.context_window if info is not None else None

    def compaction_due(self, transcript: list[Message], config: ChatConfig, model_id: str) -> bool:
        """The request's estimated input passes ``at`` x the context window."""
        if config.compaction is None:
            return False
        size = self._context_window(config, model_id)
        if size is None:
            return False
        messages = compaction.window(transcript)
        reported = self.store.transcript.last_input_tokens()
        if reported is not None and not compaction.reported_since_summary(transcript, reported[0]):
            reported = None  # that request still held the rows a later summary replaced
        estimate = compaction.estimate_tokens(messages, reported)
        return estimate > config.compaction.at * size

    def compact(self, transcript: list[Message], config: ChatConfig) -> Message | None:
        """Summarise what the next request would send but the recent rows: the summary row and
        its usage row are saved and added to ``transcript``. None when there is nothing to
        summarise (or compaction is off)."""
        if config.compaction is None:
            return None
        todo = compaction.plan(transcript, config.compaction.keep_recent)
        if todo is None:
            return None
        model = config.compaction.model or config.model or agentloop_settings.DEFAULT_MODEL
        provider_hint = None if config.compaction.model else config.provider
        provider, model_id = providers.resolve(model, provider_hint)
        provider_name = providers.split_model(model, provider_hint)[0]
        request = ModelRequest(
            model=model_id,
            messages=[
                Message(role="system", content=compaction.SUMMARY_INSTRUCTIONS),
                Message(role="user", content=compaction.render(todo)),
            ],
            headers=config.headers,
        )
        started = time.monotonic()
        response, reservation = self._summary_response(provider, provider_name, request)
        summary = Message(
            role="summary",
            content=response.content,
            model=response.model or model_id,
            provider_data={compaction.THROUGH: todo.through},
        )
        usage = UsageRecord(
            provider=provider_name,
            model=model_id,
            status="succeeded",
            usage=response.usage,
            cost=provider.cost(model_id, response.usage),
            duration_ms=int((time.monotonic() - started) * 1000),
            reservation=reservation,
        )
        record = self.store.transcript.save_answer(summary, usage)
        transcript.append(summary)
        self._emit("after_message", record)
        return summary

    def _summary_response(
        self, provider: Provider, provider_name: str, request: ModelRequest
    ) -> tuple[ModelResponse, Any]:
        """The summary call, retried like any model call, each attempt admitted first; a
        usage row for each failure. The response and its budget reservation."""
        retries = int(agentloop_settings.MODEL_RETRIES)
        for attempt in range(retries + 1):
            reservation = drive(self.admission.admit(provider, provider_name, request, None))
            started = time.monotonic()
            try:
                # Bounded like the chat's own calls: a slot, the deadline.
                sent = send(Send(provider, request, None, provider_name=provider_name))
                return sent, reservation
            except Exception as exc:
                failed = failed_usage(provider_name, request.model, exc, started)
                failed.reservation = reservation
                self.store.transcript.record_usage(failed)
                delay = retry_delay(attempt, exc) if attempt < retries else None
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover
