"""The example site's admin: the notes the demo agent saved."""

from django.contrib import admin

from .models import Note


@admin.register(Note)
class NoteAdmin(admin.ModelAdmin):
    list_display = ("id", "text", "owner", "chat", "created_at")
    raw_id_fields = ("owner", "chat")
