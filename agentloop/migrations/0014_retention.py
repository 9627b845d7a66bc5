# The usage charts' covering index (agentloop.admin.usage_charts). Built CONCURRENTLY on
# PostgreSQL, so a large usage table keeps taking rows while it builds.

import agentloop.models.indexes
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [
        ('agentloop', '0013_chat_lease_holder'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        agentloop.models.indexes.AddIndexConcurrentlyOnPostgres(
            model_name='usage',
            index=agentloop.models.indexes.IncludingOnPostgres(fields=['created_at'], name='agentloop_usage_day_idx', postgres_include=('provider', 'model', 'owner', 'cost', 'input_tokens', 'output_tokens')),
        ),
    ]
