# The approval inbox's partial indexes on tool calls (agentloop.admin.inbox): the calls
# waiting for a person by waiting_since, the decided ones by decided_at. Built CONCURRENTLY on
# PostgreSQL, so a large tool-call table keeps taking rows while they build.

import agentloop.models.indexes
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [
        ('agentloop', '0016_handoffs'),
    ]

    operations = [
        agentloop.models.indexes.AddIndexConcurrentlyOnPostgres(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('state', 'waiting')), fields=['waiting_since'], name='agentloop_toolcall_waiting_idx'),
        ),
        agentloop.models.indexes.AddIndexConcurrentlyOnPostgres(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('decided_at__isnull', False)), fields=['-decided_at'], name='agentloop_toolcall_decided_idx'),
        ),
    ]
