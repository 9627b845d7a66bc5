"""Model instances of the rows a step writes and the chat row a claim reads, built as
``Model.__init__`` and ``Model.from_db`` build them, without their per-field Python calls.

A step builds a handful of instances (its message, usage and tool-call rows; the claimed
chat, forty-odd columns): Django's constructor sets each column through ``setattr``, and a
foreign key's id through its descriptor's ``__set__`` (a Python call per key), which on a new
instance only stores the value in the instance's ``__dict__``. For a model whose
constructor is Django's own and whose column attributes are Django's own descriptors, the
instance is built here with the same ``__dict__``, the same ``_state`` and the same
``pre_init``/``post_init`` signals; a related object passed by name still goes through its
descriptor (which caches it). Any other model, or arguments outside the columns, take
Django's own path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.fields import Field, return_None  # type: ignore[attr-defined]
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

__all__ = ["Instances", "instances"]

_MISSING: Any = object()
#: the descriptors whose ``__set__`` (if any) on a new instance only stores the value.
_PLAIN_DESCRIPTORS = (DeferredAttribute, ForeignKeyDeferredAttribute)
_FROM_DB = Model.from_db.__func__  # type: ignore[attr-defined]


class Instances:
    """Instances of one model, built without Django's per-field calls where that builds
    the same instance (see the module's docstring)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        meta = model._meta
        fields = list(meta.fields)
        self.attnames = [field.attname for field in meta.concrete_fields]
        plain = (
            model.__init__ is Model.__init__
            and not meta.abstract
            and not meta.parents  # a parent's key is set with the child's: Django's path
            and fields == list(meta.concrete_fields)
            and all(
                type(model.__dict__.get(field.attname, _descriptor(model, field.attname)))
                in _PLAIN_DESCRIPTORS
                and not field.generated
                for field in fields
            )
        )
        #: ``from_db`` too is Django's own (a project's model may change what it loads).
        self.plain_from_db = plain and model.from_db.__func__ is _FROM_DB
        self.plain = plain
        #: the primary key's attribute name (``pk`` is not one of ``new``'s names).
        self.pk = meta.pk.attname
        # (name, attname, related: may be passed as an object by name, default)
        self._specs = [
            (field.name, field.attname, field.is_relation, _default(field)) for field in fields
        ]
        #: by the names ``new`` was given (in order): what to do (a ``_Plan``), or None for
        #: Django's own constructor (a name not a column's, a key given both ways).
        self._plans: dict[tuple[str, ...], _Plan | None] = {}

    def new(self, values: dict[str, Any]) -> Any:
        """``model(**values)``: ``values`` by attribute name (``chat_id``), or a related
        object by its field's name (``chat``)."""
        model = self.model
        names = tuple(values)
        plan = self._plans.get(names, _MISSING)
        if plan is _MISSING:
            plan = self._plans[names] = self._plan(names)
        if plan is None or (pre_init.receivers and _listened(model)):
            return model(**values)
        instance = model.__new__(model)
        instance._state = ModelState()
        loaded = instance.__dict__
        loaded.update(plan.constants)
        for attname, default in plan.defaults:
            loaded[attname] = default()
        loaded.update(values)
        for name in plan.related:
            # Not a column: its descriptor sets the key and caches the object, as Django's
            # __init__ does (and refuses one of the wrong model).
            del loaded[name]
            setattr(instance, name, values[name])
        if post_init.receivers:  # (none: Django's send returns at once)
            post_init.send(sender=model, instance=instance)
        return instance

    def _plan(self, names: tuple[str, ...]) -> _Plan | None:
        if not self.plain:
            return None
        given = set(names)
        related: list[str] = []
        defaults: list[tuple[str, Any]] = []
        for name, attname, is_relation, default in self._specs:
            if is_relation and name in given:
                if attname in given:
                    return None  # both: as Django has it
                related.append(name)
                given.discard(name)
            elif attname in given:
                given.discard(attname)
            else:
                defaults.append((attname, default))
        if given:
            return None  # a property's or anything else's: Django's own constructor
        return _Plan(tuple(related), defaults)

    def from_db(self, db: str, values: Sequence[Any]) -> Any:
        """``model.from_db(db, attnames, values)`` for a row of every concrete column."""
        model = self.model
        if (
            not self.plain_from_db
            or (pre_init.receivers and _listened(model))
            or len(values) != len(self.attnames)
        ):
            return model.from_db(db, self.attnames, values)
        instance = model.__new__(model)
        state = instance._state = ModelState()
        instance.__dict__.update(zip(self.attnames, values, strict=True))
        if post_init.receivers:  # (none: Django's send returns at once)
            post_init.send(sender=model, instance=instance)
        state.adding = False
        state.db = db
        return instance


class _Plan:
    """How ``Instances.new`` builds an instance from one set of names: the related objects
    passed by name (set through their descriptors) and the columns left to their default."""

    __slots__ = ("constants", "defaults", "related")

    def __init__(self, related: tuple[str, ...], defaults: list[tuple[str, Any]]) -> None:
        #: the defaults that are always the same object: None, and text's "" (``str()``).
        self.constants = {
            attname: None if default is None else ""
            for attname, default in defaults
            if default is None or default is str
        }
        defaults = [(name, default) for name, default in defaults if name not in self.constants]
        self.related = related
        self.defaults = defaults


def _listened(model: Any) -> bool:
    # A pre_init receiver may change the arguments: Django's own constructor, then.
    return pre_init.has_listeners(model)


def _default(field: Any) -> Any:
    """``field.get_default``, or None for a field whose default is None (no call then)."""
    if type(field).get_default is not Field.get_default:
        return field.get_default  # a foreign key's, say: its own
    default = field._get_default  # what Django's ``get_default`` calls (worked out once)
    return None if default is return_None else default


def _descriptor(model: Any, attname: str) -> Any:
    for klass in model.__mro__:
        if attname in klass.__dict__:
            return klass.__dict__[attname]
    return None


_INSTANCES: dict[Any, Instances] = {}


def instances(model: Any) -> Instances:
    """The builder of ``model``'s instances (worked out once per process)."""
    found = _INSTANCES.get(model)
    if found is None:
        found = _INSTANCES[model] = Instances(model)
    return found
