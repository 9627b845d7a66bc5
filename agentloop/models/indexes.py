"""Indexes on PostgreSQL's terms: INCLUDE columns there only, and built CONCURRENTLY there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import migrations, models

__all__ = ["AddIndexConcurrentlyOnPostgres", "IncludingOnPostgres"]


class IncludingOnPostgres(models.Index):
    """An index whose ``postgres_include`` columns are ``INCLUDE`` columns on PostgreSQL (so an
    index-only scan serves the query) and are left out elsewhere: SQLite has no INCLUDE, and
    Django warns (``models.W040``) on every command about an ``include`` it can't build."""

    def __init__(self, *args: Any, postgres_include: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.postgres_include = tuple(postgres_include)

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        path, args, kwargs = super().deconstruct()
        kwargs["postgres_include"] = self.postgres_include
        return path, args, kwargs

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor != "postgresql" or not self.postgres_include:
            return super().create_sql(model, schema_editor, using, **kwargs)
        built = models.Index(
            fields=list(self.fields),
            name=self.name,
            db_tablespace=self.db_tablespace,
            opclasses=list(self.opclasses),
            condition=self.condition,
            include=list(self.postgres_include),
        )
        return built.create_sql(model, schema_editor, using, **kwargs)


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """``AddIndex``, with ``CREATE INDEX CONCURRENTLY`` on PostgreSQL (outside a transaction:
    the migration sets ``atomic = False``), so a large table keeps taking rows while it builds."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        concurrently = schema_editor.connection.vendor == "postgresql"
        schema_editor.add_index(
            model, self.index, **({"concurrently": True} if concurrently else {})
        )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        concurrently = schema_editor.connection.vendor == "postgresql"
        schema_editor.remove_index(
            model, self.index, **({"concurrently": True} if concurrently else {})
        )
