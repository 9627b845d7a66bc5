"""What agentloop serves over HTTP: a chat's views, its live events, useChat.

Include the views with ``path("agentloop/", include("agentloop.web.urls"))``
(docs/install.md); the names here are for pages of your own: who may see or change a chat,
where a page rendered now reads the chat's events from, the event stream's wire format,
and a chat as the AI SDK's ``UIMessage`` list. The code lives in private modules:
``_access`` (permissions, live streams per user), ``_live`` (following a chat live) and
``_ui_protocol`` (the AI SDK's UI message protocol).
"""

from ._access import can_change_chat, can_view_chat, get_chat_for_change, get_chat_for_view
from ._live import CUT_MARK, cut_to_fit, format_event, resume_point
from ._ui_protocol import ui_messages

__all__ = [
    "CUT_MARK",
    "can_change_chat",
    "can_view_chat",
    "cut_to_fit",
    "format_event",
    "get_chat_for_change",
    "get_chat_for_view",
    "resume_point",
    "ui_messages",
]
