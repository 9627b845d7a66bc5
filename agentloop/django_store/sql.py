"""Statements built once and reused: the Django store's hot path without per-call ORM work.

Compiling a queryset or saving through ``Model.save()`` costs a few hundred microseconds
of Python per statement, more than the statement itself on a short chat. The store's
every-step reads and inserts go through these instead; the SQL is still Django's (the
compiler's for reads, the model's columns and ``get_db_prep_save`` for inserts), so every
supported database and field type works as with the ORM. Inserts bypass ``Model.save()``:
``pre_save``/``post_save`` are not sent for them (``agentloop.signals`` are).
"""

from __future__ import annotations

from typing import Any

from django.db import connections

__all__ = ["PreparedInsert", "PreparedSelect"]


class PreparedSelect:
    """A queryset compiled once; each ``rows()`` runs it and applies Django's converters."""

    def __init__(self, queryset: Any, *, raw_columns: frozenset[int] = frozenset()) -> None:
        self.using = queryset.db
        self.compiler = queryset.query.get_compiler(using=self.using)
        self.sql, self.params = self.compiler.as_sql()
        fields = [selected[0] for selected in self.compiler.select[: self.compiler.col_count]]
        # Columns in ``raw_columns`` come back as the driver gives them: the caller
        # converts them itself (faster where it knows the values' shape).
        self.converters = {
            index: converter
            for index, converter in self.compiler.get_converters(fields).items()
            if index not in raw_columns
        }

    def rows(self) -> list[Any]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(self.sql, self.params)
            rows = cursor.fetchall()
        if self.converters:
            return list(self.compiler.apply_converters(rows, self.converters))
        return rows


class PreparedInsert:
    """``INSERT`` of one model instance, its SQL built once per database."""

    def __init__(self, model: Any) -> None:
        self.model = model
        meta = model._meta
        self.pk = meta.pk
        self.fields = [field for field in meta.concrete_fields if not field.primary_key]
        self._sql: dict[str, tuple[str, bool]] = {}

    def _statement(self, connection: Any) -> tuple[str, bool]:
        cached = self._sql.get(connection.alias)
        if cached is None:
            quote = connection.ops.quote_name
            columns = ", ".join(quote(field.column) for field in self.fields)
            placeholders = ", ".join(["%s"] * len(self.fields))
            # Only quoted identifiers from the model's own metadata go into the text;
            # values are always parameters.
            table = quote(self.model._meta.db_table)
            sql = f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"  # noqa: S608
            returning = bool(connection.features.can_return_columns_from_insert)
            if returning:
                sql += f" RETURNING {quote(self.pk.column)}"
            cached = self._sql[connection.alias] = (sql, returning)
        return cached

    def insert(self, instance: Any, using: str) -> Any:
        """Insert ``instance`` (not saved before); sets and returns its primary key."""
        connection = connections[using]
        sql, returning = self._statement(connection)
        params = [
            field.get_db_prep_save(getattr(instance, field.attname), connection)
            for field in self.fields
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if returning:
                pk = cursor.fetchone()[0]
            else:
                pk = connection.ops.last_insert_id(
                    cursor, self.model._meta.db_table, self.pk.column
                )
        instance.pk = pk
        instance._state.adding = False
        instance._state.db = using
        return pk
