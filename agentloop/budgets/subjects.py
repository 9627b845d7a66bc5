"""Budget subjects: whom a chat's spend counts against.

By default a chat's owner (``"owner 42"``); ``AGENTLOOP["BUDGET_SUBJECT"]`` names a function
``subject(chat)`` that chooses: a model instance (a team, a tenant), a string, a
:class:`Subject`, a list of them (each one's budget holds: a user's and their team's), or
None (no budget counts the chat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import models

from ..conf import agentloop_settings
from ..exceptions import ConfigurationError
from ..import_paths import load_by_path

__all__ = ["Subject", "owner_subject", "subject_hook", "subjects_of"]


@dataclass(frozen=True)
class Subject:
    """A budget subject: its key (a ``Budget`` row's ``subject``) and how it is shown."""

    key: str
    label: str = ""

    def __post_init__(self) -> None:
        if not self.key or len(self.key) > 255:
            raise ConfigurationError(
                f"A budget subject's key must be 1 to 255 characters, not {self.key!r}"
            )
        if not self.label:
            object.__setattr__(self, "label", self.key)

    @classmethod
    def of(cls, value: Any) -> Subject:
        """The subject for what a ``BUDGET_SUBJECT`` function returned: a model instance
        ("auth.user:42", shown "owner 42" for the user model, else "<verbose name> <pk>"), a
        string (itself) or a Subject."""
        if isinstance(value, Subject):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, models.Model) and value.pk is not None:
            meta = value._meta
            if isinstance(value, get_user_model()):
                label = f"owner {value.pk}"
            else:
                label = f"{meta.verbose_name} {value.pk}"
            return cls(f"{meta.label_lower}:{value.pk}", label)
        raise ConfigurationError(
            f"AGENTLOOP['BUDGET_SUBJECT'] returned {value!r}: give a saved model instance, a "
            "string, an agentloop.budgets.Subject, a list of them, or None."
        )


def owner_subject(chat: Any) -> Subject | None:
    """The default subject: the chat's owner (no query: its key is read off the row)."""
    owner_id = getattr(chat, "owner_id", None)
    if owner_id is None:
        return None
    return Subject(f"{get_user_model()._meta.label_lower}:{owner_id}", f"owner {owner_id}")


def subject_hook() -> Any:
    """The function ``BUDGET_SUBJECT`` names (``ConfigurationError`` when it can't be
    loaded or isn't callable); :func:`owner_subject` when it names none."""
    path = agentloop_settings.BUDGET_SUBJECT
    if not path:
        return owner_subject
    hook = load_by_path(path)
    if not callable(hook):
        raise ConfigurationError(f"AGENTLOOP['BUDGET_SUBJECT'] = {path!r} is not callable.")
    return hook


def subjects_of(chat: Any) -> list[Subject]:
    """The subjects whose budgets hold for ``chat``, without repeats, in key order."""
    found = subject_hook()(chat)
    if found is None:
        return []
    values = found if isinstance(found, list | tuple | set | frozenset) else [found]
    subjects = {subject.key: subject for subject in map(Subject.of, values) if subject}
    return [subjects[key] for key in sorted(subjects)]
