"""Admin: a chat's change page is a timeline of its transcript; the list scales to many chats.

Importing this package registers ``Chat`` (``chat_admin``), ``ToolCall``, ``Usage`` and
``Message`` (``row_lists``), ``Batch`` (``batch_admin``), ``Budget`` (``budget_admin``:
spend against budget per subject), ``Memory`` (``memory_admin``: by subject and owner,
searched by text or meaning), the evals' sets, runs and cases (``eval_admin``) and the MCP
tokens (``mcp_token_admin``) with the default admin site. The chat list's filters and
actions live in ``filters`` and ``actions``; the timeline its change page renders is
``build_timeline`` (``timeline``); the approval inbox across chats is ``ApprovalInbox``
(``approval_inbox``), served by ``ChatAdmin``.
"""

from .actions import (
    approve_pending,
    cancel_chats,
    deny_pending,
    halt_chats,
    resume_chats,
    switch_model,
)
from .approval_inbox import ApprovalInbox
from .batch_admin import BatchAdmin
from .budget_admin import BudgetAdmin
from .chat_admin import ChatAdmin
from .eval_admin import EvalCaseAdmin, EvalRunAdmin, EvalSetAdmin, make_eval_set
from .mcp_token_admin import MCPTokenAdmin
from .memory_admin import MemoryAdmin
from .row_lists import MessageAdmin, ToolCallAdmin, UsageAdmin
from .timeline import Timeline, build_timeline

# What a project subclasses or reuses in an admin of its own (a custom chat model's admin:
# docs/custom-models.md); the labels, filters and entry types stay in their modules.
__all__ = [
    "ApprovalInbox",
    "BatchAdmin",
    "BudgetAdmin",
    "ChatAdmin",
    "EvalCaseAdmin",
    "EvalRunAdmin",
    "EvalSetAdmin",
    "MCPTokenAdmin",
    "MemoryAdmin",
    "MessageAdmin",
    "Timeline",
    "ToolCallAdmin",
    "UsageAdmin",
    "approve_pending",
    "build_timeline",
    "cancel_chats",
    "deny_pending",
    "halt_chats",
    "make_eval_set",
    "resume_chats",
    "switch_model",
]
