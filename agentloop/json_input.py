"""JSON sent by people (a ``useChat`` body, an approver's edited arguments), read with bounds.

``parse_json(raw)`` refuses, with :class:`JSONInputError` and a one-line reason, a text longer
than ``JSON_MAX_BYTES`` or nested deeper than ``JSON_MAX_DEPTH``, before the parser sees it:
Python's parser recurses once per level, so a body nested 100,000 deep would otherwise end in
``RecursionError`` (a 500), and one just under the interpreter's limit in a later
``json.dumps`` or database write. The views answer the error with a 400; the admin's JSON
form fields (:class:`BoundedJSONFormField`) with a form error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.core.exceptions import RequestDataTooBig, ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest

from .conf import agentloop_settings

__all__ = [
    "ADMIN_JSON_FIELDS",
    "BoundedJSONFormField",
    "JSONInputError",
    "check_json_bounds",
    "json_depth_exceeds",
    "parse_json",
    "request_json",
]

# A bracket, or a whole string (skipped: brackets inside strings don't nest anything).
_TOKENS = re.compile(r'[\[\]{}]|"[^"\\]*(?:\\.[^"\\]*)*"')


class JSONInputError(ValueError):
    """JSON a person sent can't be taken; the message is one line, fit to show them."""


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` opens more than ``limit`` arrays or objects inside each other (one
    pass, no recursion; it stops at the first level too deep)."""
    depth = 0
    for token in _TOKENS.finditer(text):
        kind = token.group()
        if kind in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif kind in ("]", "}"):
            depth -= 1
    return False


def check_json_bounds(raw: bytes | str, what: str = "The request") -> str:
    """``raw`` as text, once it is known to be at most ``JSON_MAX_BYTES`` long and nested at
    most ``JSON_MAX_DEPTH`` deep; else :class:`JSONInputError` (one line, naming ``what``)."""
    max_bytes = agentloop_settings.JSON_MAX_BYTES
    max_depth = agentloop_settings.JSON_MAX_DEPTH
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise JSONInputError(f"{what}: too large ({size} bytes of JSON; at most {max_bytes}).")
    try:  # bytes as json.loads reads them (UTF-8, 16 or 32)
        text = (
            raw.decode(json.detect_encoding(raw), "surrogatepass")
            if isinstance(raw, bytes)
            else raw
        )
    except UnicodeDecodeError:
        raise JSONInputError(f"{what} must be JSON.") from None
    if json_depth_exceeds(text, max_depth):
        raise JSONInputError(f"{what}: nested too deeply (at most {max_depth} levels of JSON).")
    return text


def parse_json(raw: bytes | str, what: str = "The request") -> Any:
    """The JSON value of ``raw`` within :func:`check_json_bounds`; :class:`JSONInputError`
    (one line, naming ``what``) when it is out of them or not JSON."""
    text = check_json_bounds(raw, what)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise JSONInputError(f"{what} must be JSON.") from None


def request_json(request: HttpRequest) -> Any:
    """The request's body as JSON (an empty body is ``null``), bounded as :func:`parse_json`;
    a body over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is refused the same way."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise JSONInputError("The request: too large (over DATA_UPLOAD_MAX_MEMORY_SIZE).") from None
    return parse_json(body or b"null")


class BoundedJSONFormField(forms.JSONField):
    """Django's JSON form field, within ``JSON_MAX_BYTES`` and ``JSON_MAX_DEPTH``: a value out
    of them is a form error (one line), never parsed (the admin's change forms use it)."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not self.disabled:
            try:
                check_json_bounds(value, "This JSON")
            except JSONInputError as exc:
                raise ValidationError(str(exc), code="invalid") from None
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        # The form shown again with its error: the text as typed, not parsed.
        if isinstance(data, str) and not self.disabled:
            try:
                check_json_bounds(data)
            except JSONInputError:
                return InvalidJSONInput(data)
        return super().bound_data(data, initial)


#: ``ModelAdmin.formfield_overrides`` for agentloop's admin: every JSON field bounded.
ADMIN_JSON_FIELDS: dict[Any, dict[str, Any]] = {
    models.JSONField: {"form_class": BoundedJSONFormField}
}
