"""Indexes on PostgreSQL's terms: INCLUDE columns there only, built CONCURRENTLY there, and
pgvector's extension and HNSW indexes there (the memories' vectors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import migrations, models

__all__ = [
    "AddHnswIndexOnPostgres",
    "AddIndexConcurrentlyOnPostgres",
    "CreateVectorExtensionOnPostgres",
    "IncludingOnPostgres",
]


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
        self._change(schema_editor, to_state.apps.get_model(app_label, self.model_name), "add")

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        self._change(schema_editor, model, "remove")

    def _change(self, schema_editor: Any, model: Any, change: str) -> None:
        """``add`` or ``remove`` the index, concurrently on PostgreSQL."""
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        concurrently = schema_editor.connection.vendor == "postgresql"
        getattr(schema_editor, f"{change}_index")(
            model, self.index, **({"concurrently": True} if concurrently else {})
        )


class CreateVectorExtensionOnPostgres(migrations.operations.base.Operation):
    """``CREATE EXTENSION vector`` (pgvector) on PostgreSQL, nothing elsewhere. When the server
    has no such extension, or the role may not create it, the error says how to get it."""

    reduces_to_sql = True
    reversible = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # no model changes

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'")
            if cursor.fetchone():
                return
            cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
            available = cursor.fetchone() is not None
        if not available:
            raise RuntimeError(
                "PostgreSQL has no 'vector' extension (pgvector), which agentloop's memories "
                "need: install it on the database server (PGDG's postgresql-NN-pgvector "
                "package, Homebrew's pgvector, or enable it on a managed PostgreSQL), then "
                'migrate again (see "Memory" in the agentloop docs).'
            )
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        pass  # other tables may use the extension: it stays

    def describe(self) -> str:
        return "Create the pgvector extension (PostgreSQL only)"


class AddHnswIndexOnPostgres(migrations.operations.base.Operation):
    """An HNSW index (cosine distance) on PostgreSQL for the rows of ``model_name`` whose
    ``dimensions`` is ``dimensions``: the vector column cast to ``halfvec(dimensions)``, a
    partial index, so one column holds vectors of several models. Nothing elsewhere (the
    search there is exact). Queries use the same cast (``MemoryQuerySet.nearest``).

    Half precision halves the index (at 1,536 dimensions a graph node's vector takes 3 KB, not
    6 KB), so twice the rows fit the memory an HNSW build and its searches want, at no
    measurable recall cost (bench/README.md), and it admits up to 4,000 dimensions (``vector``
    indexes stop at 2,000). The column keeps full precision."""

    reversible = True

    def __init__(self, model_name: str, name: str, column: str, dimensions: int) -> None:
        self.model_name = model_name
        self.name = name
        self.column = column
        self.dimensions = dimensions

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"model_name": self.model_name, "name": self.name, "column": self.column,
                  "dimensions": self.dimensions}  # fmt: skip
        return type(self).__qualname__, [], kwargs

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # the index is PostgreSQL's own, not in the model's Meta

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        quote = schema_editor.quote_name
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {quote(self.name)} ON {quote(model._meta.db_table)} "
            f"USING hnsw (({quote(self.column)}::halfvec({int(self.dimensions)})) "
            f"halfvec_cosine_ops) WHERE {quote('dimensions')} = {int(self.dimensions)}"
        )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(self.name)}")

    def describe(self) -> str:
        return f"HNSW index {self.name} on {self.model_name} ({self.dimensions} dimensions)"
