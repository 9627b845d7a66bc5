# Batch-mode eval runs (docs/evals.md, "Through a batch API"): a run flagged as batched, the
# batch holding each case's next model call, the replay so far between rounds, and the eval
# run a batch belongs to; a case's cost to 8 decimals, as usage rows (a batch price has them).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentloop', '0024_elicitation'),
    ]

    operations = [
        migrations.AddField(
            model_name='batch',
            name='eval_run',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='batches', to='agentloop.evalrun', verbose_name='eval run'),
        ),
        migrations.AddField(
            model_name='evalcase',
            name='batch',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='eval_cases', to='agentloop.batch', verbose_name='batch'),
        ),
        migrations.AddField(
            model_name='evalcase',
            name='replayed',
            field=models.JSONField(blank=True, default=list, editable=False, verbose_name='replayed so far'),
        ),
        migrations.AddField(
            model_name='evalrun',
            name='batched',
            field=models.BooleanField(default=False, verbose_name='through batches'),
        ),
        migrations.AlterField(
            model_name='evalcase',
            name='cost',
            field=models.DecimalField(blank=True, decimal_places=8, max_digits=14, null=True, verbose_name='cost'),
        ),
    ]
