"""Every error agentloop raises, under one root.

    AgentloopError
    ├── ConfigurationError          a setting, model name or import path is wrong
    │   ├── UnknownProviderError    no provider is registered under that name
    │   └── AttachmentError         an attachment can't be sent (its type, size or source)
    ├── CancelledError              the run stopped because cancel() was requested
    ├── ChatStoppedError            the turn stopped: the chat is ``stopped``, with the reason
    │   ├── LimitReachedError       a per-turn limit stopped the turn before a model call
    │   │   └── BudgetExceededError a budget or quota of the chat's subject stopped it
    │   └── GuardrailBlockedError   a guardrail blocked the user's message, an answer or a tool call
    ├── GuardrailError              a guardrail raised, returned no decision or took too long
    ├── RateLimitWaiting            a background step waits for a fleet rate limit (sent again)
    ├── PlaceWaiting                a background chat waits in line for a chats-in-flight place
    ├── PendingToolCallsError       ask_later() while tool calls still wait for results
    ├── EditError                   edit(), regenerate() or fork() named a message they can't act on
    ├── ConcurrentWriteError        another process wrote the same step first
    │   ├── LeaseLostError          this worker's lease on the chat expired and was taken over
    │   └── ChatBusyError           another process (or thread) runs a verb of this chat now
    ├── ToolError                   raised by a tool: the model sees the message as an error result
    ├── ToolWaiting                 raised by a tool: its call waits (for a person, a subagent)
    │   └── NeedsInput              the call waits for a person's answer to a question
    ├── ToolCallNotWaitingError     approve/deny/answer for a call that isn't waiting for that
    │   └── DecisionConflictError   someone else decided that call first (a race: views say 409)
    ├── InvalidArgumentsError       approve(arguments=...) that the tool's Params refuse
    ├── InvalidAnswerError          an answer to an MCP server's question its schema refuses
    ├── BatchError                  these chats can't go into one batch (or the provider has none)
    ├── MCPServerError              an MCP server can't be reached, timed out, or broke the protocol
    └── ProviderError               the model provider failed (status and redacted body attached)
        ├── RateLimitError          429 (transient)
        ├── ServerError             5xx (transient)
        ├── ProviderTimeout         no answer in time (transient)
        ├── StreamInterruptedError  the stream ended before the answer did (transient)
        ├── AuthenticationError     401/403 (permanent)
        ├── ContextLengthError      the conversation is too long for the model (permanent)
        ├── BadRequestError         400 and other 4xx (permanent)
        ├── InvalidResponseError    the answer could not be parsed (permanent)
        │   └── ResponseTooLargeError   the answer is over MAX_RESPONSE_BYTES (permanent)
        └── BatchItemNotRunError    a batch ended (cancelled, expired) before this request ran

Transient provider errors have ``retryable = True``; ``retry_after`` carries the
provider's ``Retry-After`` in seconds when it sent one.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentloopError",
    "AttachmentError",
    "AuthenticationError",
    "BadRequestError",
    "BatchError",
    "BatchItemNotRunError",
    "BudgetExceededError",
    "CancelledError",
    "ChatBusyError",
    "ChatStoppedError",
    "ConcurrentWriteError",
    "ConfigurationError",
    "ContextLengthError",
    "DecisionConflictError",
    "EditError",
    "GuardrailBlockedError",
    "GuardrailError",
    "InvalidAnswerError",
    "InvalidArgumentsError",
    "InvalidResponseError",
    "LeaseLostError",
    "LimitReachedError",
    "MCPServerError",
    "NeedsInput",
    "PendingToolCallsError",
    "PlaceWaiting",
    "ProviderError",
    "ProviderTimeout",
    "RateLimitError",
    "RateLimitWaiting",
    "ResponseTooLargeError",
    "ServerError",
    "StreamInterruptedError",
    "ToolCallNotWaitingError",
    "ToolError",
    "ToolWaiting",
    "UnknownProviderError",
]


class AgentloopError(Exception):
    """Root of every agentloop error."""


class ConfigurationError(AgentloopError):
    """A setting, model name or import path cannot be used."""


class UnknownProviderError(ConfigurationError):
    """No provider is registered under the requested name."""


class AttachmentError(ConfigurationError):
    """An attachment can't be sent: an unsupported type, too large, or an unusable source."""


class CancelledError(AgentloopError):
    """The run stopped at a checkpoint because cancellation was requested."""

    def __init__(self, message: str = "Cancelled", *, requested_at: object = None) -> None:
        super().__init__(message)
        #: when cancel() was called (the value the checkpoint read).
        self.requested_at = requested_at
        #: set once the engine has cleared the flag and recorded what was cut short.
        self.recorded = False


class ChatStoppedError(AgentloopError):
    """The turn stopped before its end: the chat is ``stopped`` with ``reason`` as its
    ``stop_reason`` (a worker's job reports "stopped"). The next user message goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LimitReachedError(ChatStoppedError):
    """A per-turn limit was reached; no further model call was made this turn."""


class GuardrailBlockedError(ChatStoppedError):
    """A guardrail blocked the user's message, an answer, or a tool call (one that stops the
    chat): ``reason`` is the chat's stop reason, "guardrail <name>: <its reason>"."""

    def __init__(self, reason: str, *, guardrail: str = "", stage: str = "") -> None:
        super().__init__(reason)
        #: the guardrail's name, and its stage ("input", "output" or "tool").
        self.guardrail = guardrail
        self.stage = stage


class GuardrailError(AgentloopError):
    """A guardrail raised, returned something that is not a decision, or did not decide
    within its time limit: it fails closed (what it judged is not sent on; the chat is
    marked failed). A guardrail that can't be loaded is a ``ConfigurationError``."""


class BudgetExceededError(LimitReachedError):
    """A budget or quota of the chat's subject (its owner, or what ``BUDGET_SUBJECT``
    chooses) has no room for the next model call; no call was made. ``reason`` is the line
    the chat shows, e.g. "budget: $20.00/day reached for owner 42"."""

    def __init__(self, reason: str, *, subject: str = "", limit: str = "") -> None:
        super().__init__(reason)
        #: the subject, as shown ("owner 42", "team 7").
        self.subject = subject
        #: which limit: "cost_per_day", "cost_per_month", "tokens_per_day",
        #: "tokens_per_month" or "chats_in_flight".
        self.limit = limit


class RateLimitWaiting(AgentloopError):  # noqa: N818 - a wait, not a failure
    """A background step must wait longer than ``RATE_LIMIT_WAIT`` for a fleet rate limit:
    it ends before its model call (nothing is sent or charged) and its job is sent again in
    ``seconds``. The chat stays queued; ``chat.waiting_for`` says why."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(f"{reason} (about {seconds:.1f} s)")
        self.seconds = seconds
        #: what the chat waits for, e.g. "rate limit: openai requests per minute".
        self.reason = reason


class PlaceWaiting(AgentloopError):  # noqa: N818 - a wait, not a failure
    """A background chat found every place of its subject's ``chats_in_flight`` quota taken:
    it ends before its model call (nothing is sent or charged) and waits in line, queued,
    with no job in flight; the chat that frees a place sends its job, in the order the
    chats came. ``chat.waiting_for`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        #: what the chat waits for, e.g. "budget: 1 chat in flight reached for owner 42".
        self.reason = reason


class PendingToolCallsError(AgentloopError):
    """A user message cannot be added while tool calls are unanswered."""


class EditError(AgentloopError, ValueError):
    """``edit()``, ``regenerate()`` or ``fork()`` named a message they can't act on (not in
    the chat, superseded already, not a user message for ``edit``), or gave no text; the
    message says which. Nothing was written."""


class ConcurrentWriteError(AgentloopError):
    """Another process wrote the same step first (e.g. answered the same tool call)."""


class LeaseLostError(ConcurrentWriteError):
    """This worker no longer holds the chat's lease: it must not write anything."""


class ChatBusyError(ConcurrentWriteError):
    """Another process or thread holds the chat's claim (a worker's job, another request):
    one writer at a time, so this verb did nothing. Wait for it, or cancel() its run."""


class ToolError(AgentloopError):
    """Raised inside a tool: the message goes back to the model as an error result."""


class ToolWaiting(AgentloopError):  # noqa: N818 - a state, not a failure
    """Raised inside a tool: its call has no result yet and waits (``reason``)."""

    reason = "subagent"

    def __init__(self, message: str = "", question: str | None = None, then: Any = None) -> None:
        super().__init__(message or self.reason)
        self.question = question
        #: called once the call is recorded as waiting (e.g. to start the subagent, so
        #: it can't finish before its parent call waits for it).
        self.then = then


class NeedsInput(ToolWaiting):  # noqa: N818 - a request, not a failure
    """Raised inside a tool to pause the call until a person answers ``question``.

    The answer (``chat.answer(tool_call_id, text)``) becomes the call's result.
    """

    reason = "question"

    def __init__(self, question: str) -> None:
        super().__init__(question, question=question)


class ToolCallNotWaitingError(AgentloopError):
    """approve(), deny() or answer() named a call that is not waiting for that decision."""


class InvalidArgumentsError(AgentloopError, ValueError):
    """Edited arguments given with ``approve(arguments=...)`` that the tool's ``Params``
    refuse (the message says which and why). Nothing was written; the call still waits."""


class InvalidAnswerError(AgentloopError, ValueError):
    """An answer to an MCP server's question (``chat.answer``) that the schema the server
    asked for refuses (the message says which field and why). Nothing was written; the
    question still waits."""


class DecisionConflictError(ToolCallNotWaitingError):
    """The call stopped waiting while this decision was made: another decision (an approve
    racing a deny, two answers) or the run itself got there first. Nothing was written."""


class BatchError(AgentloopError):
    """Chats that can't go into one batch: not awaiting the model, mixed providers or models,
    or a provider without a batch API. The message names the chats and why."""


class MCPServerError(AgentloopError):
    """An MCP server could not be reached, did not answer in time, or broke the protocol.

    The message names the server; a tool call that meets it gives the model an error result.
    """


class ProviderError(AgentloopError):
    """The model provider failed.

    ``status`` is the HTTP status when there was one; ``body`` is the response
    body with anything that looks like a credential removed.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.retry_after = retry_after


class RateLimitError(ProviderError):
    """The provider asked us to slow down (HTTP 429)."""

    retryable = True


class ServerError(ProviderError):
    """The provider failed on its side (HTTP 5xx)."""

    retryable = True


class ProviderTimeout(ProviderError):  # noqa: N818 - reads better than ProviderTimeoutError
    """The provider did not answer in time."""

    retryable = True


class StreamInterruptedError(ProviderError):
    """The stream ended before the answer was complete."""

    retryable = True


class AuthenticationError(ProviderError):
    """The API key is missing, wrong or not allowed (HTTP 401/403)."""


class ContextLengthError(ProviderError):
    """The conversation does not fit the model's context window."""


class BadRequestError(ProviderError):
    """The provider rejected the request (HTTP 400 and other 4xx)."""


class InvalidResponseError(ProviderError):
    """The provider's answer could not be understood."""


class ResponseTooLargeError(InvalidResponseError):
    """The provider's answer (plain or streamed) is larger than ``MAX_RESPONSE_BYTES``."""


class BatchItemNotRunError(ProviderError):
    """The batch ended (cancelled or expired) before the provider ran this request.

    Nothing was charged and the chat is as it was: the request can be sent again.
    """

    retryable = True
