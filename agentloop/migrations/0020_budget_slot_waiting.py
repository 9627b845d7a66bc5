# The chats-in-flight quota queues: a chat that finds every place taken waits in line.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentloop', '0019_editing'),
    ]

    operations = [
        migrations.AddField(
            model_name='budgetslot',
            name='waiting_since',
            field=models.DateTimeField(blank=True, null=True, verbose_name='waiting since'),
        ),
    ]
