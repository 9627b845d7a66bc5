# Evals (docs/evals.md): sets of stored chats and turns, runs of a candidate over a set, and
# one case per replayed turn with its answer, scores, cost and latency.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentloop', '0021_memory'),
    ]

    operations = [
        migrations.CreateModel(
            name='EvalSet',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True, verbose_name='name')),
                ('description', models.TextField(blank=True, verbose_name='description')),
                ('items', models.JSONField(blank=True, default=list, verbose_name='items')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False, verbose_name='created at')),
            ],
            options={
                'verbose_name': 'eval set',
                'verbose_name_plural': 'eval sets',
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='EvalRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(blank=True, max_length=200, verbose_name='name')),
                ('model', models.CharField(max_length=200, verbose_name='model')),
                ('provider', models.CharField(blank=True, max_length=100, verbose_name='provider')),
                ('instructions', models.TextField(blank=True, null=True, verbose_name='instructions')),
                ('tools', models.JSONField(blank=True, default=list, verbose_name='tools (import paths)')),
                ('agent_path', models.CharField(blank=True, max_length=300, verbose_name='agent import path')),
                ('settings', models.JSONField(blank=True, default=dict, verbose_name='settings')),
                ('live_tools', models.JSONField(blank=True, default=list, verbose_name='tools run for real')),
                ('scorers', models.JSONField(blank=True, default=list, verbose_name='scorers')),
                ('fail_under', models.FloatField(blank=True, null=True, verbose_name='fail under (pass rate)')),
                ('max_cost', models.DecimalField(blank=True, decimal_places=6, max_digits=12, null=True, verbose_name='cost limit')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False, verbose_name='created at')),
                ('baseline', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='agentloop.evalrun', verbose_name='baseline')),
                ('eval_set', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='runs', to='agentloop.evalset', verbose_name='eval set')),
            ],
            options={
                'verbose_name': 'eval run',
                'verbose_name_plural': 'eval runs',
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='EvalCase',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('position', models.PositiveIntegerField(verbose_name='position')),
                ('item', models.JSONField(blank=True, default=dict, editable=False, verbose_name='item')),
                ('input', models.TextField(blank=True, verbose_name='input')),
                ('reference', models.TextField(blank=True, verbose_name='recorded answer')),
                ('state', models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('passed', 'passed'), ('failed', 'failed'), ('error', 'error'), ('skipped', 'skipped')], default='pending', max_length=20, verbose_name='state')),
                ('answer', models.TextField(blank=True, verbose_name='answer')),
                ('tool_calls', models.JSONField(blank=True, default=list, verbose_name='tool calls')),
                ('unmatched_calls', models.PositiveIntegerField(default=0, verbose_name='calls with no recording')),
                ('scores', models.JSONField(blank=True, default=list, verbose_name='scores')),
                ('score', models.FloatField(blank=True, null=True, verbose_name='score')),
                ('cost', models.DecimalField(blank=True, decimal_places=6, max_digits=12, null=True, verbose_name='cost')),
                ('input_tokens', models.PositiveIntegerField(default=0, verbose_name='input tokens')),
                ('output_tokens', models.PositiveIntegerField(default=0, verbose_name='output tokens')),
                ('latency_ms', models.PositiveIntegerField(blank=True, null=True, verbose_name='latency (ms)')),
                ('error', models.TextField(blank=True, verbose_name='error')),
                ('lease_token', models.CharField(blank=True, editable=False, max_length=64, verbose_name='lease token')),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True, verbose_name='lease expires at')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='attempts')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
                ('source_chat', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='agentloop.chat', verbose_name='source chat')),
                ('source_message', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='agentloop.message', verbose_name='user turn')),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='cases', to='agentloop.evalrun', verbose_name='run')),
            ],
            options={
                'verbose_name': 'eval case',
                'verbose_name_plural': 'eval cases',
                'ordering': ['run', 'position'],
                'indexes': [models.Index(condition=models.Q(('state__in', ['pending', 'running'])), fields=['run', 'state'], name='agentloop_evalcase_open_idx')],
                'constraints': [models.UniqueConstraint(fields=('run', 'position'), name='agentloop_evalcase_pos_uniq')],
            },
        ),
    ]
