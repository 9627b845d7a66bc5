"""The text and JSON fields of agentloop's models: each value made storable on its way in.

The one place where text becomes storable (``agentloop.storable_text``) is where Django builds a
column's value for the database, ``get_prep_value``: every write goes through it (``save``,
``create``, ``update``, ``bulk_create``, the admin's forms, and the store's own statements,
whose values ``field_values`` prepares the same way), so no path writes around it, and a
lookup's value is made storable alike (a filter finds what was stored).

In migrations these are Django's own fields (``deconstruct``): what they change is the
value, not the column, so no migration was needed and none is (a project's concrete models
built from the abstract ones included). As with any field subclass, an expression that mixes
one of these columns with a plain ``Value("...")`` (a ``Case``, a ``Coalesce``) names its
``output_field``.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from ..storable_text import storable_json, storable_text

__all__ = ["StorableCharField", "StorableJSONField", "StorableTextField"]


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
