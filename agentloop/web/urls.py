"""URLs: ``path("agentloop/", include("agentloop.web.urls"))``."""

from django.urls import path

from . import views

app_name = "agentloop"

#: what a person does with a call that waits for them: the path's last word and its view.
_CALL_VERBS = (
    ("approve", views.approve_tool_call),
    ("deny", views.deny_tool_call),
    ("answer", views.answer_tool_call),
    ("decline", views.decline_question),
)

urlpatterns = [
    path("chats/<int:pk>/cancel/", views.cancel_chat, name="cancel"),
    path("chats/<int:pk>/events/", views.chat_events, name="events"),
    path("chats/<int:pk>/regenerate/", views.regenerate_answer, name="regenerate"),
    path("chats/<int:pk>/messages/<int:message_pk>/edit/", views.edit_message, name="edit"),
    *(
        path(f"chats/<int:pk>/tool-calls/<int:call_pk>/{verb}/", view, name=verb)
        for verb, view in _CALL_VERBS
    ),
    # AG-UI (HttpAgent posts a RunAgentInput to one URL; threadId is the chat's pk).
    path("ag-ui", views.ag_ui, name="ag-ui"),
    # useChat (the AI SDK): no trailing slash, as its transport appends "/<id>/stream".
    path("usechat", views.usechat, name="usechat"),
    path("usechat/<int:pk>/stream", views.usechat_stream, name="usechat-stream"),
    path("usechat/<int:pk>/messages", views.usechat_messages, name="usechat-messages"),
]
