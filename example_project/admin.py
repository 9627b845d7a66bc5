"""The example site's admin: the notes the demo agent saved, tickets, support chats."""

from django.contrib import admin

from agentloop.admin import ChatAdmin

from .models import Note, SupportConversation, Ticket

# A chat model of the project's own gets agentloop's chat admin (timeline, filters, actions).
admin.site.register(SupportConversation, ChatAdmin)
admin.site.register(Ticket)


@admin.register(Note)
class NoteAdmin(admin.ModelAdmin):
    list_display = ("id", "text", "owner", "chat", "created_at")
    raw_id_fields = ("owner", "chat")
