"""The store prepares column values without Django's calls where it can
(``agentloop.django_store.fields``): the result must be exactly what each field's own
``get_db_prep_save`` gives, on this database, for every column a step writes and for values
on and off the fast paths."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from functools import partial

import pytest
from django.db import connection, models
from django.utils.translation import gettext_lazy

from agentloop.django_store.fields import (
    EMPTY_ARRAY,
    EMPTY_OBJECT,
    Casts,
    EmptyJson,
    RowConverters,
    Saving,
    quick_json_converters,
    save_value,
)
from agentloop.django_store.writes import Values
from agentloop.messages import MessageStatus
from agentloop.models import Chat, Message, ToolCall, Usage

SAMPLES = [
    None,
    "",
    "text",
    "a NUL \x00 and a lone \ud800 surrogate",  # made storable alike (agentloop.storable_text)
    gettext_lazy("lazy text"),
    MessageStatus.COMPLETE,
    True,
    False,
    0,
    7,
    2.5,
    Decimal("0.25"),
    {},
    {"a": [1, 2]},
    [],
    ["x"],
    {"key \x00": ["\udc00", float("nan")]},
    datetime(2026, 12, 1, 12, 30, tzinfo=UTC),
]


def comparable(value):
    """A prepared value as a comparable thing: its type and what it holds (psycopg wraps
    JSON in an object that has no equality of its own)."""
    held = getattr(value, "obj", value)
    return type(value), repr(held)


def fields():
    for model in (Chat, Message, ToolCall, Usage):
        for field in model._meta.concrete_fields:
            if not field.primary_key:
                yield pytest.param(field, id=f"{model.__name__}.{field.name}")


def prepared_by_django(field, value):
    try:
        return comparable(field.get_db_prep_save(value, connection))
    except Exception as exc:  # a value the field refuses: it must be refused alike
        return type(exc), str(exc)


def prepared_here(field, value):
    try:
        return comparable(save_value(field, value, connection))
    except Exception as exc:
        return type(exc), str(exc)


@pytest.mark.django_db
@pytest.mark.parametrize("field", list(fields()))
def test_each_value_is_prepared_as_the_field_itself_prepares_it(field):
    for value in SAMPLES:
        assert prepared_here(field, value) == prepared_by_django(field, value), value


@pytest.mark.django_db
def test_a_row_is_prepared_column_by_column_as_django_would():
    fields = [field for field in Message._meta.concrete_fields if not field.primary_key]
    chat = Chat.objects.create(model="test:x")
    row = Message(chat=chat, role="assistant", content="hi", provider_data={"k": 1})
    ours = Saving(fields).of(row, connection)
    theirs = [field.get_db_prep_save(getattr(row, field.attname), connection) for field in fields]
    assert [comparable(value) for value in ours] == [comparable(value) for value in theirs]


@pytest.mark.django_db
def test_a_field_of_a_subclass_goes_through_its_own_preparation():
    class Shouting(models.CharField):
        def get_prep_value(self, value):
            return super().get_prep_value(value).upper()

    field = Shouting(max_length=10)
    field.set_attributes_from_name("loud")
    assert save_value(field, "quiet", connection) == "QUIET"


@pytest.mark.django_db
def test_a_naive_datetime_warns_as_with_django():
    field = Message._meta.get_field("created_at")
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        save_value(field, datetime(2026, 12, 1, 12, 30), connection)  # noqa: DTZ001


def every_field():
    for model in (Chat, Message, ToolCall, Usage):
        for field in model._meta.concrete_fields:  # the keys too: an UPDATE's WHERE has them
            yield pytest.param(field, id=f"{model.__name__}.{field.name}")


def each(prepare):
    try:
        return prepare()
    except Exception as exc:
        return type(exc), str(exc)


@pytest.mark.django_db
@pytest.mark.parametrize("field", list(every_field()))
def test_a_row_prepares_each_value_as_the_field_itself_does(field):
    # A row's values go through the row's own loop (the usual cases without a call), one
    # column alone and two at once alike.
    samples = [*SAMPLES, 12, Chat(pk=3)]
    for value in samples:
        theirs = prepared_by_django(field, value)
        alone = each(
            partial(lambda one: comparable(Saving([field]).values([one], connection)[0]), value)
        )
        assert alone == theirs, value
        row = type("Row", (), {field.attname: value})()
        for saving in (Saving([field]), Saving([field, field])):
            marked = each(partial(saving.of_marking_empty_json, row, connection))
            if isinstance(marked, tuple):  # refused: as Django refuses it
                assert marked == theirs, value
                continue
            for ours in marked:
                if isinstance(ours, EmptyJson):  # an empty object or array, as a constant
                    assert ours is (EMPTY_OBJECT if value == {} else EMPTY_ARRAY), value
                    assert isinstance(field, models.JSONField) and field.encoder is None
                    assert value in ({}, []) and type(value) in (dict, list)
                else:
                    assert comparable(ours) == theirs, value


@pytest.mark.django_db
@pytest.mark.parametrize("field", list(every_field()))
def test_a_statement_writes_each_value_as_its_prepared_value(field):
    # ``Saving.expressions`` (the usual cases inline) against the prepared values, each
    # written as ``Values.add`` writes it: the same expressions, the same parameters.
    casts = [Casts("T"), Casts("T")]
    saving = Saving([field, field])
    for value in [*SAMPLES, 12]:
        row = type("Row", (), {field.attname: value})()
        reference = Values()
        try:
            expected = [
                reference.add(one, "T") for one in saving.of_marking_empty_json(row, connection)
            ]
        except Exception as exc:
            with pytest.raises(type(exc)):
                saving.expressions(row, connection, casts, [])
            continue
        params: list = []
        assert saving.expressions(row, connection, casts, params) == expected, value
        assert [comparable(one) for one in params] == [
            comparable(one) for one in reference.params
        ], value


@pytest.mark.django_db
def test_rows_are_converted_as_django_converts_them():
    Chat.objects.create(
        model="test:x", tools=["a"], headers={}, limits={"b": 1}, output_schema=None
    )
    Chat.objects.create(model="test:y")
    queryset = Chat.objects.order_by("pk")
    compiler = queryset.query.get_compiler(using="default")
    compiler.setup_query()
    fields = [selected[0] for selected in compiler.select]
    with connection.cursor() as cursor:
        cursor.execute(*compiler.as_sql())
        rows = cursor.fetchall()
    django_converters = compiler.get_converters(fields)
    theirs = [list(row) for row in compiler.apply_converters(rows, django_converters)]
    ours = RowConverters(quick_json_converters(django_converters)).rows(rows, connection)
    assert ours == theirs
