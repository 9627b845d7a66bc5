"""The committed migrations match the models: no drift."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()

    # --check exits non-zero (SystemExit) when a migration would be written.
    call_command("makemigrations", "agentloop", "--check", "--dry-run", stdout=out, stderr=out)

    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_code_deployed_before_the_lease_holder_column_still_creates_chats():
    """A rolling deploy: the migration ran, and a process still on the old code inserts a
    chat naming none of the new column. The database's own default fills it."""
    from django.db import connection

    from agentloop.models import Chat

    chat = Chat.objects.create(model="scripted:test")
    columns = [
        f.column
        for f in Chat._meta.concrete_fields
        if not f.primary_key and f.name != "lease_holder"
    ]
    quoted = ", ".join(connection.ops.quote_name(column) for column in columns)
    table = connection.ops.quote_name(Chat._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {quoted} FROM {table} WHERE id = %s", [chat.pk])  # noqa: S608
        row = cursor.fetchone()
        marks = ", ".join(["%s"] * len(columns))
        cursor.execute(f"INSERT INTO {table} ({quoted}) VALUES ({marks})", row)  # noqa: S608

    assert Chat.objects.exclude(pk=chat.pk).get().lease_holder == ""
