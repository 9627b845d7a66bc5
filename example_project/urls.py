"""URLs of the example site: its chat pages, login, the admin, and agentloop's own views."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path

from . import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.chat_list, name="chat_list"),
    path("chats/new/", views.new_chat, name="chat_new"),
    path("chats/<int:pk>/", views.chat_detail, name="chat_detail"),
    path("chats/<int:pk>/messages/", views.send_message, name="chat_send"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("agentloop/", include("agentloop.web.urls")),
]
