# Memories (docs/memory.md): what an owner's chats keep across conversations, with their
# embeddings; on PostgreSQL a pgvector column with an HNSW index (cosine) for 1,536 dimensions.

import agentloop.models.indexes
import agentloop.models.memories
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentloop", "0020_budget_slot_waiting"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        agentloop.models.indexes.CreateVectorExtensionOnPostgres(),
        migrations.CreateModel(
            name="Memory",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("subject", models.CharField(max_length=255, verbose_name="subject")),
                (
                    "agent",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="agent"),
                ),
                ("text", models.TextField(verbose_name="text")),
                ("metadata", models.JSONField(blank=True, default=dict, verbose_name="metadata")),
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
                ("updated_at", models.DateTimeField(auto_now=True, verbose_name="updated at")),
                (
                    "expires_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="expires at"),
                ),
                (
                    "chat",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="memories",
                        to="agentloop.chat",
                        verbose_name="chat",
                    ),
                ),
                (
                    "message",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="memories",
                        to="agentloop.message",
                        verbose_name="message",
                    ),
                ),
                (
                    "owner",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="agentloop_memories",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
            ],
            options={
                "verbose_name": "memory",
                "verbose_name_plural": "memories",
                "ordering": ["-created_at"],
                "abstract": False,
                "indexes": [
                    models.Index(
                        fields=["subject", "agent", "created_at"], name="agentloop_memory_subj_idx"
                    ),
                    models.Index(fields=["owner", "created_at"], name="agentloop_memory_owner_idx"),
                ],
            },
        ),
        agentloop.models.indexes.AddHnswIndexOnPostgres(
            model_name="memory",
            name="agentloop_memory_hnsw_1536",
            column="embedding",
            dimensions=1536,
        ),
    ]
