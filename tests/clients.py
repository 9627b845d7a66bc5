"""Test clients for the views' tests: a person logged in with the staff flag and agentloop
permissions a test asks for (``owner`` in tests/conftest.py is the chats' owner)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import Permission
from django.test import Client


def logged_in(
    django_user_model: Any, username: str, *, staff: bool = False, perms: Iterable[str] = ()
) -> Client:
    """A client logged in as a new person ``username`` with agentloop's ``perms``
    (codenames such as ``"change_chat"``)."""
    person = django_user_model.objects.create_user(username=username, is_staff=staff)
    for codename in perms:
        person.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label="agentloop")
        )
    client = Client()
    client.force_login(person)
    return client
