"""How the admin finds a chat model's related models, so it serves any ``AbstractChat``."""

from __future__ import annotations

from typing import Any


def related_model(model: Any, name: str) -> Any:
    """The model behind a chat's reverse relation (``messages``, ``tool_calls``, ...)."""
    return model._meta.get_field(name).related_model


def has_field(model: Any, name: str) -> bool:
    return any(field.name == name for field in model._meta.get_fields())
