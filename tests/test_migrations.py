"""The committed migrations match the models: no drift."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()

    # --check exits non-zero (SystemExit) when a migration would be written.
    call_command("makemigrations", "agentloop", "--check", "--dry-run", stdout=out, stderr=out)

    assert "No changes detected" in out.getvalue()
