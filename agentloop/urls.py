"""URLs: ``path("agentloop/", include("agentloop.urls"))``."""

from django.urls import path

from . import views

app_name = "agentloop"

urlpatterns = [
    path("chats/<int:pk>/cancel/", views.cancel_chat, name="cancel"),
]
