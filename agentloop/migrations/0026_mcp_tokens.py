# Tokens for the agents served over MCP (docs/mcp.md): one row per token, its SHA-256 only.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentloop', '0025_eval_batches'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='MCPToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(blank=True, help_text='What it is for.', max_length=100, verbose_name='name')),
                ('digest', models.CharField(editable=False, max_length=64, unique=True, verbose_name='SHA-256 of the token')),
                ('shown', models.CharField(editable=False, max_length=32, verbose_name='starts with')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False, verbose_name='created at')),
                ('last_used_at', models.DateTimeField(blank=True, editable=False, null=True, verbose_name='last used at')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='agentloop_mcp_tokens', to=settings.AUTH_USER_MODEL, verbose_name='user')),
            ],
            options={
                'verbose_name': 'MCP token',
                'verbose_name_plural': 'MCP tokens',
                'ordering': ['-created_at'],
            },
        ),
    ]
