# The usage charts' covering index (agentloop.admin.usage_charts). Built CONCURRENTLY on
# PostgreSQL, so a large usage table keeps taking rows while it builds.

import agentloop.models.indexes
from django.conf import settings
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
        ('agentloop', '0013_chat_lease_holder'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name='usage',
            index=agentloop.models.indexes.IncludingOnPostgres(fields=['created_at'], name='agentloop_usage_day_idx', postgres_include=('provider', 'model', 'owner', 'cost', 'input_tokens', 'output_tokens')),
        ),
    ]
