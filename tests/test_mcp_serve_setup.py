"""Setting up the agents served over MCP (docs/mcp.md, serving agents): tokens stored as
digests, shown once, made and revoked in the admin and by ``manage.py agentloop mcp-token``,
what they authenticate; the system check of ``AGENTLOOP["MCP_SERVE"]``."""

from __future__ import annotations

import hashlib
import re
from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse

from agentloop.models import MCPToken

pytestmark = pytest.mark.django_db


def test_a_token_is_stored_as_its_digest_and_authenticates_its_active_user(user):
    row, raw = MCPToken.objects.issue(user, name="laptop")

    assert raw.startswith("agentloop_") and len(raw) > 40
    assert row.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in {row.digest, row.shown, row.name} and raw.startswith(row.shown)
    assert MCPToken.objects.authenticate(raw) == user
    assert MCPToken.objects.get().last_used_at is not None
    assert MCPToken.objects.authenticate(raw[:-1]) is None
    assert MCPToken.objects.authenticate(row.digest) is None  # the stored form lets no one in
    user.is_active = False
    user.save()
    assert MCPToken.objects.authenticate(raw) is None


def test_the_admin_makes_a_token_and_shows_it_once(admin_client, user):
    answer = admin_client.post(
        reverse("admin:agentloop_mcptoken_add"), {"user": user.pk, "name": "IDE"}, follow=True
    )

    shown = [str(message) for message in get_messages(answer.wsgi_request)]
    (raw,) = re.findall(r"agentloop_[\w-]{40,}", " ".join(shown))
    assert MCPToken.objects.authenticate(raw) == user
    row = MCPToken.objects.get()
    assert (row.name, row.user) == ("IDE", user)
    page = admin_client.get(reverse("admin:agentloop_mcptoken_change", args=[row.pk]))
    assert raw not in page.content.decode()  # never again
    assert row.shown in page.content.decode()
    admin_client.post(reverse("admin:agentloop_mcptoken_delete", args=[row.pk]), {"post": "yes"})
    assert MCPToken.objects.authenticate(raw) is None


def test_the_command_makes_lists_and_revokes_tokens(user):
    out = StringIO()
    call_command("agentloop", "mcp-token", "create", "ada", "--name", "ci", stdout=out)
    raw = out.getvalue().splitlines()[-1]
    assert MCPToken.objects.authenticate(raw) == user

    listed = StringIO()
    call_command("agentloop", "mcp-token", "list", "--user", "ada", stdout=listed)
    row = MCPToken.objects.get()
    assert listed.getvalue().startswith(f"{row.shown}…  ada  ci  used ")
    assert raw not in listed.getvalue()

    with pytest.raises(CommandError, match="No user 'nobody'"):
        call_command("agentloop", "mcp-token", "create", "nobody")
    with pytest.raises(CommandError, match="0 tokens start with 'agentloop_zzzzzzz'"):
        call_command("agentloop", "mcp-token", "revoke", "agentloop_zzzzzzz")
    call_command("agentloop", "mcp-token", "revoke", row.shown, stdout=StringIO())
    assert not MCPToken.objects.exists()

    again = StringIO()
    call_command("agentloop", "mcp-token", "create", "ada", stdout=again)
    whole = again.getvalue().splitlines()[-1]
    call_command("agentloop", "mcp-token", "revoke", whole, stdout=StringIO())  # the token itself
    assert not MCPToken.objects.exists()


def test_the_system_check_names_each_agent_that_cannot_be_offered(settings):
    from agentloop.checks import check_mcp_serve

    agents = [
        "tests.mcp_agents.Reporter",
        "tests.mcp_agents.Nowhere",
        "tests.mcp_agents.publish",
        "tests.agents.Research",
        "tests.agents.Writer",
    ]
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "MCP_SERVE": {"agents": agents}}):
        errors = check_mcp_serve()

    assert {error.id for error in errors} == {"agentloop.E015"}
    assert [error.msg for error in errors] == [
        "AGENTLOOP['MCP_SERVE']['agents']: Could not import 'tests.mcp_agents.Nowhere': "
        "module 'tests.mcp_agents' has no attribute 'Nowhere'",
        "AGENTLOOP['MCP_SERVE']['agents']: tests.mcp_agents.publish is not an agentloop.Agent "
        "class.",
    ]
    with override_settings(
        AGENTLOOP={**settings.AGENTLOOP, "MCP_SERVE": {"agents": agents[:1] * 2}}
    ):
        (twice,) = check_mcp_serve()
    assert "both offered as the tool 'reporter'" in twice.msg
