"""Admin: a chat's change page is a timeline of its transcript; the list scales to many chats.

Importing this package registers ``Chat`` (``chats``), ``ToolCall``, ``Usage`` and
``Message`` (``rows``) and ``Batch`` (``batches``) with the default admin site. The chat
list's filters and actions live in ``filters`` and ``actions``; the timeline its change
page renders is ``build_timeline`` (``timeline``).
"""

from .actions import (
    DEFAULT_DENY_REASON,
    approve_pending,
    cancel_chats,
    deny_pending,
    resume_chats,
)
from .batches import BatchAdmin, BatchItemInline
from .chats import CONFIG_FIELDS, DECIDED_MESSAGES, ChatAdmin
from .filters import OwnerFilter, ProblemFilter, WaitingFilter
from .rows import MessageAdmin, ToolCallAdmin, UsageAdmin
from .timeline import (
    DECISION_LABELS,
    WAIT_LABELS,
    CallEntry,
    Entry,
    Timeline,
    build_timeline,
    format_cost,
)

__all__ = [
    "CONFIG_FIELDS",
    "DECIDED_MESSAGES",
    "DECISION_LABELS",
    "DEFAULT_DENY_REASON",
    "WAIT_LABELS",
    "BatchAdmin",
    "BatchItemInline",
    "CallEntry",
    "ChatAdmin",
    "Entry",
    "MessageAdmin",
    "OwnerFilter",
    "ProblemFilter",
    "Timeline",
    "ToolCallAdmin",
    "UsageAdmin",
    "WaitingFilter",
    "approve_pending",
    "build_timeline",
    "cancel_chats",
    "deny_pending",
    "format_cost",
    "resume_chats",
]
