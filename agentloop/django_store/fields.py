"""The text and JSON fields of agentloop's models: each value made storable on its way in.

The one place where text becomes storable (``agentloop.storable_text``) is where Django builds a
column's value for the database, ``get_prep_value``: every write goes through it (``save``,
``create``, ``update``, ``bulk_create``, the admin's forms, and the store's own statements,
whose values :func:`save_value` prepares the same way), so no path writes around it, and a
lookup's value is made storable alike (a filter finds what was stored).

In migrations these are Django's own fields (``deconstruct``): what they change is the
value, not the column, so no migration was needed and none is (a project's concrete models
built from the abstract ones included). As with any field subclass, an expression that mixes
one of these columns with a plain ``Value("...")`` (a ``Case``, a ``Coalesce``) names its
``output_field``.

Column values as Django prepares them for saving, and reads JSON back, the usual cases
done without its calls.

``Field.get_db_prep_save`` goes through four or five Python calls per value (the expression
check, ``get_db_prep_value``, ``get_prep_value``, the lazy-string check, ``to_python``), and
a step's write prepares about forty values. For the field classes of Django's own that every
row of a step has (text, booleans, integers, floats, aware datetimes, JSON), and for the
value types those calls would return unchanged or hand to the backend's own adapter, the
result is worked out here directly: the same value, or the same adapter call
(``connection.ops``). The storable fields above are done here
too: their text through ``storable_text``, their JSON through ``storable_json``, as their
own ``get_prep_value`` does. Anything else, a field of another subclass included, goes to
the field's own ``get_db_prep_save``.

Reading, a chat row has a dozen JSON columns that nearly always hold ``[]`` or ``{}``:
:func:`quick_json_converters` has those decoded without the JSON decoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models.expressions import Col

from ..storable_text import storable_json, storable_text

__all__ = [
    "Casts",
    "EMPTY_ARRAY",
    "EMPTY_OBJECT",
    "EmptyJson",
    "Saving",
    "StorableCharField",
    "StorableJSONField",
    "StorableTextField",
    "optional_link",
    "RowConverters",
    "quick_json_converters",
    "save_value",
]


def _text(value: Any) -> Any:
    return storable_text(value) if isinstance(value, str) else value


class _Storable:
    """What the three fields add to the Django field they extend: the value prepared for the
    database made storable by ``storable``; in migrations, that Django field itself."""

    storable: Any

    def get_prep_value(self, value: Any) -> Any:
        return self.storable(super().get_prep_value(value))  # type: ignore[misc]

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()  # type: ignore[misc]
        django = next(c for c in type(self).__mro__ if c.__module__.startswith("django.db."))
        return name, f"django.db.models.{django.__name__}", args, kwargs


class StorableCharField(_Storable, models.CharField):
    """A ``CharField`` whose text is made storable (``storable_text``)."""

    storable = staticmethod(_text)


class StorableTextField(_Storable, models.TextField):
    """A ``TextField`` whose text is made storable (``storable_text``)."""

    storable = staticmethod(_text)


class StorableJSONField(_Storable, models.JSONField):
    """A ``JSONField`` whose strings (keys too) are made storable and whose non-finite
    numbers are stored as null (``storable_json``)."""

    storable = staticmethod(storable_json)


def optional_link(
    to: Any,
    verbose_name: Any,
    related_name: str,
    on_delete: Any = models.SET_NULL,
    field: type[models.ForeignKey] = models.ForeignKey,
    **options: Any,
) -> Any:
    """A link to another row that may be empty (``null``, and ``blank`` in forms); by
    default emptied when that row is deleted. ``field`` may be ``OneToOneField``."""
    return field(
        to,
        verbose_name=verbose_name,
        null=True,
        blank=True,
        on_delete=on_delete,
        related_name=related_name,
        **options,
    )


# What a field of exactly one of these classes does with a value of the usual type.
(
    _TEXT,
    _BOOL,
    _FLOAT,
    _INT,
    _DATETIME,
    _JSON,
    _RELATED,
    _STORABLE_TEXT,
    _STORABLE_JSON,
    _OTHER,
    _AUTO,
    _KEY,
) = range(12)


_KINDS: dict[type[Any], int] = {
    models.CharField: _TEXT,
    models.TextField: _TEXT,
    models.BooleanField: _BOOL,
    models.FloatField: _FLOAT,
    models.IntegerField: _INT,
    models.SmallIntegerField: _INT,
    models.BigIntegerField: _INT,
    models.PositiveIntegerField: _INT,
    models.PositiveSmallIntegerField: _INT,
    models.PositiveBigIntegerField: _INT,
    models.DateTimeField: _DATETIME,
    models.JSONField: _JSON,
    StorableCharField: _STORABLE_TEXT,
    StorableTextField: _STORABLE_TEXT,
    StorableJSONField: _STORABLE_JSON,
}


#: the JSON fields read back with Django's own decoder (``quick_json_converters``).
_PLAIN_JSON = (models.JSONField, StorableJSONField)


#: the kinds whose ``get_db_prep_save(None)`` is None itself.
_NONE_AS_IS = frozenset(
    (_TEXT, _BOOL, _FLOAT, _JSON, _RELATED, _KEY, _STORABLE_TEXT, _STORABLE_JSON)
)


#: Django's own auto-increment keys: an int of theirs is prepared by the backend's
#: ``validate_autopk_value`` alone (``AutoFieldMixin.get_db_prep_value``).
_AUTO_FIELDS = (models.AutoField, models.BigAutoField, models.SmallAutoField)


def _kind(field: Any) -> int:
    kind = _KINDS.get(type(field))
    if kind is not None:
        return kind
    if type(field) in _AUTO_FIELDS:
        return _AUTO
    if (
        isinstance(field, models.ForeignKey)
        and type(field).get_db_prep_save is models.ForeignKey.get_db_prep_save
    ):
        # Its own saving is the target's (None as None): a key of Django's own is _AUTO's.
        return _KEY if type(field.target_field) in _AUTO_FIELDS else _RELATED
    return _OTHER


def _prepared(field: Any, kind: int, internal: str, value: Any, connection: Any) -> Any:
    """``field.get_db_prep_save(value, connection)``."""
    kind_of_value = type(value)
    if value is None:
        if kind in _NONE_AS_IS:
            return None  # each returns None as it is
        if kind == _INT:
            return connection.ops.adapt_integerfield_value(None, internal)
        if kind == _DATETIME:
            return connection.ops.adapt_datetimefield_value(None)
    elif kind == _STORABLE_TEXT:  # first: most columns of agentloop's rows are these
        # A str's subclass too (a state's enum): Django's ``to_python`` keeps it as it is.
        if kind_of_value is str or isinstance(value, str):
            return storable_text(value)
    elif kind == _TEXT:
        if kind_of_value is str or isinstance(value, str):
            return value
    elif kind == _AUTO or kind == _KEY:
        if kind_of_value is int:
            return connection.ops.validate_autopk_value(value)
    elif kind == _BOOL:
        if kind_of_value is bool:
            return value
    elif kind == _INT:
        if kind_of_value is int:
            return connection.ops.adapt_integerfield_value(value, internal)
    elif kind == _FLOAT:
        if kind_of_value is float:
            return value
    elif kind == _DATETIME:
        # An aware datetime: no warning, no conversion before the backend's adapter.
        if kind_of_value is datetime and value.utcoffset() is not None:
            return connection.ops.adapt_datetimefield_value(value)
    elif kind == _JSON and kind_of_value in (dict, list):
        return connection.ops.adapt_json_value(value, field.encoder)
    elif kind == _STORABLE_JSON and kind_of_value in (dict, list):
        return connection.ops.adapt_json_value(storable_json(value), field.encoder)
    return field.get_db_prep_save(value, connection)


def _keeps(ops: Any) -> tuple[bool, bool]:
    """Whether ``ops`` (a backend's operations) returns as it is an aware datetime
    (``adapt_datetimefield_value``: PostgreSQL's) and an auto key's int
    (``validate_autopk_value``: Django's own default); noted by the class of ``ops``."""
    kind = type(ops)
    found = _KEEPS.get(kind)
    if found is None:
        method = kind.adapt_datetimefield_value
        found = _KEEPS[kind] = (
            method.__module__ == "django.db.backends.postgresql.operations"
            and method.__qualname__ == "DatabaseOperations.adapt_datetimefield_value",
            kind.validate_autopk_value is BaseDatabaseOperations.validate_autopk_value,
        )
    return found


_KEEPS: dict[type[Any], tuple[bool, bool]] = {}


def save_value(field: Any, value: Any, connection: Any) -> Any:
    """``field.get_db_prep_save(value, connection)`` for one value."""
    return _prepared(field, _kind(field), field.get_internal_type(), value, connection)


class EmptyJson:
    """An empty JSON object or array of a plain ``JSONField`` (no encoder of its own), in place
    of its prepared value: a statement may write it as a constant (``literal``)."""

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def __repr__(self) -> str:
        return f"<EmptyJson {self.literal}>"


EMPTY_OBJECT, EMPTY_ARRAY = EmptyJson("'{}'"), EmptyJson("'[]'")


class Saving:
    """The columns of ``fields``, prepared for saving (worked out once per field list)."""

    def __init__(self, fields: Sequence[Any]) -> None:
        self.fields = list(fields)
        self._specs = [
            (field, field.attname, _kind(field), field.get_internal_type()) for field in self.fields
        ]
        # All the columns' values of an instance in one call (a tuple, for two or more).
        attnames = [field.attname for field in self.fields]
        self._read: Any = (
            attrgetter(*attnames)
            if len(attnames) > 1
            else lambda instance: [getattr(instance, name) for name in attnames]
        )

    def of(self, instance: Any, connection: Any) -> list[Any]:
        """Each field's value on ``instance``, prepared as ``get_db_prep_save`` would."""
        return [
            _prepared(field, kind, internal, getattr(instance, attname), connection)
            for field, attname, kind, internal in self._specs
        ]

    def of_marking_empty_json(self, instance: Any, connection: Any) -> list[Any]:
        """:meth:`of`, with :data:`EMPTY_OBJECT` or :data:`EMPTY_ARRAY` for a plain JSON
        column holding ``{}`` or ``[]`` (most of a step's JSON values)."""
        return _prepared_row(self._specs, self._read(instance), connection, True)

    def values(self, values: Sequence[Any], connection: Any) -> list[Any]:
        """``values`` (one per field, in order), prepared."""
        return _prepared_row(self._specs, values, connection, False)

    def expressions(
        self, instance: Any, connection: Any, casts: Sequence[Casts], params: list[Any]
    ) -> list[str]:
        """``instance``'s columns as a statement writes them, each value as
        :meth:`of_marking_empty_json` prepares it: a constant (NULL, a boolean, ``''``, an
        empty JSON object or array) as its column's expression of it in ``casts``, any other
        value as a parameter (appended to ``params``)."""
        parts: list[str] = []
        append = parts.append
        prepared = self.of_marking_empty_json(instance, connection)
        for value, cast in zip(prepared, casts, strict=True):
            kind = type(value)
            if value is None:
                append(cast.null)
            elif kind is bool:
                append(cast.true if value else cast.false)
            elif kind is str and not value:
                append(cast.empty)
            elif value is EMPTY_OBJECT:
                append(cast.empty_object)
            elif value is EMPTY_ARRAY:
                append(cast.empty_array)
            else:
                params.append(value)
                append(cast.param)
        return parts


class Casts:
    """A column's value expressions in a statement (``Saving.expressions``): NULL, true,
    false, ``''``, ``{}`` and ``[]`` as constants of its SQL type, and a parameter."""

    __slots__ = ("empty", "empty_array", "empty_object", "false", "null", "param", "true")

    def __init__(self, sql_type: str) -> None:
        self.null = f"CAST(NULL AS {sql_type})"
        self.true = f"CAST(true AS {sql_type})"
        self.false = f"CAST(false AS {sql_type})"
        self.empty = f"CAST('' AS {sql_type})"
        self.empty_object = f"CAST({EMPTY_OBJECT.literal} AS {sql_type})"
        self.empty_array = f"CAST({EMPTY_ARRAY.literal} AS {sql_type})"
        self.param = f"CAST(%s AS {sql_type})"


def _prepared_row(
    specs: list[tuple[Any, str, int, str]], row: Sequence[Any], connection: Any, mark: bool
) -> list[Any]:
    """Each of ``row``'s values prepared by ``_prepared``, the usual cases without its call
    (a step prepares some fifty values); ``mark``: an empty JSON object or array of a plain
    JSON column as :data:`EMPTY_OBJECT` or :data:`EMPTY_ARRAY`."""
    values: list[Any] = []
    append = values.append
    keeps, keeps_keys = _KEEPS.get(type(connection.ops)) or _keeps(connection.ops)
    for (field, _, kind, internal), value in zip(specs, row, strict=True):
        if value is None:
            if kind in _NONE_AS_IS or (kind == _DATETIME and keeps):
                append(None)
                continue
        elif kind == _STORABLE_TEXT:
            # ``storable_text`` returns ASCII text without a NUL as it is.
            if (
                (type(value) is str or isinstance(value, str))
                and value.isascii()
                and "\x00" not in value
            ):
                append(value)
                continue
        elif kind == _JSON or kind == _STORABLE_JSON:
            if mark and not value and field.encoder is None:
                if type(value) is dict:
                    append(EMPTY_OBJECT)
                    continue
                if type(value) is list:
                    append(EMPTY_ARRAY)
                    continue
        elif kind == _BOOL:
            if type(value) is bool:
                append(value)
                continue
        elif kind == _DATETIME:
            # An aware datetime, to a backend whose adapter returns it as it is.
            if keeps and type(value) is datetime and value.utcoffset() is not None:
                append(value)
                continue
        elif kind == _KEY or kind == _AUTO:
            if keeps_keys and type(value) is int:
                append(value)
                continue
        elif kind == _TEXT:
            if type(value) is str or isinstance(value, str):
                append(value)
                continue
        append(_prepared(field, kind, internal, value, connection))
    return values


def quick_json_converters(converters: dict[int, tuple[list[Any], Any]]) -> dict[int, Any]:
    """A compiler's ``get_converters()`` with the JSON columns of Django's own ``JSONField``
    (no decoder of its own) decoding ``[]`` and ``{}`` at once; the others as they were."""
    quick: dict[int, Any] = {}
    for index, (functions, expression) in converters.items():
        field: Any = getattr(expression, "target", None)
        plain = (
            type(field) in _PLAIN_JSON
            and field.decoder is None
            and type(expression) is Col
            and functions == [field.from_db_value]
        )
        quick[index] = (
            ([_JsonReader(field.from_db_value)], expression) if plain else (functions, expression)
        )
    return quick


class _JsonReader:
    """A plain JSON column's converter: ``[]`` and ``{}`` decoded at once (by
    :class:`RowConverters` without a call), anything else by the field's own
    ``from_db_value``."""

    __slots__ = ("decode",)

    def __init__(self, decode: Any) -> None:
        self.decode = decode

    def __call__(self, value: Any, expression: Any, connection: Any) -> Any:
        if value == "[]":
            return []
        if value == "{}":
            return {}
        return self.decode(value, expression, connection)


class RowConverters:
    """A compiler's converters (after :func:`quick_json_converters`) applied to whole rows as
    Django's ``SQLCompiler.apply_converters`` applies them; a quick JSON column's ``[]`` and
    ``{}`` without a call, and the columns with no converter not looked at."""

    def __init__(self, converters: dict[int, tuple[list[Any], Any]]) -> None:
        self.converters = converters
        #: (position, the field's own decoder, the column): the quick JSON columns.
        self._json: list[tuple[int, Any, Any]] = []
        #: (position, converters, the column): the others.
        self._other: list[tuple[int, list[Any], Any]] = []
        for position, (functions, expression) in converters.items():
            if len(functions) == 1 and type(functions[0]) is _JsonReader:
                self._json.append((position, functions[0].decode, expression))
            else:
                self._other.append((position, functions, expression))

    def rows(self, rows: Sequence[Sequence[Any]], connection: Any) -> list[list[Any]]:
        """``rows`` converted (``connection``: the compiler's), each a new list."""
        result = []
        json_columns, other = self._json, self._other
        for row in rows:
            row = list(row)
            for position, decode, expression in json_columns:
                value = row[position]
                if value is None:
                    continue  # Django's JSONField reads NULL as None
                if value == "[]":
                    row[position] = []
                elif value == "{}":
                    row[position] = {}
                else:
                    row[position] = decode(value, expression, connection)
            for position, functions, expression in other:
                value = row[position]
                for function in functions:
                    value = function(value, expression, connection)
                row[position] = value
            result.append(row)
        return result
