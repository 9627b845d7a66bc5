# The approval inbox's partial indexes on tool calls (agentloop.admin.inbox): the calls
# waiting for a person by waiting_since, the decided ones by decided_at. Built CONCURRENTLY on
# PostgreSQL, so a large tool-call table keeps taking rows while they build.

from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """``AddIndex``, with ``CREATE INDEX CONCURRENTLY`` on PostgreSQL (outside a transaction)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [
        ('agentloop', '0016_handoffs'),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('state', 'waiting')), fields=['waiting_since'], name='agentloop_toolcall_waiting_idx'),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('decided_at__isnull', False)), fields=['-decided_at'], name='agentloop_toolcall_decided_idx'),
        ),
    ]
