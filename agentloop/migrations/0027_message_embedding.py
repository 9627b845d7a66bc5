# Past chats' messages embedded for search across an owner's chats (opt-in: docs/memory.md);
# on PostgreSQL an HNSW index (cosine) for 1,536 dimensions, as the memories have.

import agentloop.models.indexes
import agentloop.models.memories
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentloop", "0026_mcp_tokens"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="MessageEmbedding",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "embedding",
                    agentloop.models.memories.EmbeddingField(
                        blank=True, null=True, verbose_name="embedding"
                    ),
                ),
                (
                    "embedding_model",
                    models.CharField(blank=True, max_length=200, verbose_name="embedding model"),
                ),
                (
                    "dimensions",
                    models.PositiveIntegerField(blank=True, null=True, verbose_name="dimensions"),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        default=django.utils.timezone.now, editable=False, verbose_name="created at"
                    ),
                ),
                (
                    "chat",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="agentloop.chat",
                        verbose_name="chat",
                    ),
                ),
                (
                    "message",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="past_chat_embedding",
                        to="agentloop.message",
                        verbose_name="message",
                    ),
                ),
                (
                    "owner",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
            ],
            options={
                "verbose_name": "message embedding",
                "verbose_name_plural": "message embeddings",
                "indexes": [
                    models.Index(fields=["owner", "chat"], name="agentloop_msgemb_owner_idx")
                ],
            },
        ),
        agentloop.models.indexes.AddHnswIndexOnPostgres(
            model_name="messageembedding",
            name="agentloop_msgemb_hnsw_1536",
            column="embedding",
            dimensions=1536,
        ),
    ]
