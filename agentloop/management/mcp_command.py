"""``manage.py agentloop mcp-serve`` and ``mcp-token``: the agents served over MCP's stdio,
and the tokens that let a user in (docs/mcp.md, serving agents).

    manage.py agentloop mcp-serve                 (the token in $AGENTLOOP_MCP_TOKEN)
    manage.py agentloop mcp-token create USERNAME [--name TEXT]
    manage.py agentloop mcp-token list [--user USERNAME]
    manage.py agentloop mcp-token revoke STARTS_WITH

``mcp-serve`` speaks MCP on its stdin and stdout (an MCP client starts it as a
subprocess); the token says whose chats its calls make, and an unknown or revoked one
stops it before it reads anything. ``create`` prints the token once: only its digest is
stored.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ..models import MCPToken
from ..models.mcp_tokens import SHOWN, digest

__all__ = ["add_mcp_parsers", "mcp_handlers"]

#: the environment variable ``mcp-serve`` reads its token from (not the command line,
#: which other users of the machine can see).
TOKEN_VARIABLE = "AGENTLOOP_MCP_TOKEN"  # noqa: S105 - a variable's name, not a secret


def add_mcp_parsers(subcommands: Any) -> None:
    """Add ``mcp-serve`` and ``mcp-token`` to the command's parser."""
    subcommands.add_parser(
        "mcp-serve",
        help="Serve the agents of AGENTLOOP['MCP_SERVE'] over MCP on stdin/stdout.",
        description=(
            f"An MCP server on stdin and stdout, for a client that starts it. ${TOKEN_VARIABLE} "
            "holds the user's token (manage.py agentloop mcp-token create USERNAME); the "
            "chats its calls make are that user's."
        ),
    )
    tokens = subcommands.add_parser("mcp-token", help="Make, list and revoke MCP tokens.")
    actions = tokens.add_subparsers(dest="action", metavar="action", required=True)
    create = actions.add_parser("create", help="A new token for a user, printed once.")
    create.add_argument("username", metavar="USERNAME")
    create.add_argument("--name", default="", help="What the token is for.")
    listed = actions.add_parser("list", help="The tokens (their first characters), newest first.")
    listed.add_argument("--user", metavar="USERNAME", help="Only this user's.")
    revoke = actions.add_parser("revoke", help="Delete a token: it lets nobody in any more.")
    revoke.add_argument("starts_with", metavar="STARTS_WITH", help="The token's first characters.")


def mcp_handlers(command: BaseCommand) -> dict[str, Any]:
    """The subcommands' handlers, by name."""
    return {
        "mcp-serve": lambda **options: serve_stdio(command),
        "mcp-token": lambda **options: handle_tokens(command, options),
    }


def serve_stdio(command: BaseCommand) -> None:
    raw = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not raw:
        raise CommandError(
            f"Set ${TOKEN_VARIABLE} to a token (manage.py agentloop mcp-token create)."
        )
    user = MCPToken.objects.authenticate(raw)
    if user is None:
        raise CommandError(
            f"${TOKEN_VARIABLE} is not a valid token (unknown, revoked or inactive user)."
        )
    user_pk = user.pk
    # Local: the mcp SDK is an optional extra, imported once the command runs.
    from mcp.server.stdio import stdio_server

    # Local: the server module imports the mcp SDK (the mcp extra).
    from ..web._mcp_server import build_server

    def user_of(ctx: Any) -> Any:
        # Checked again at each call: a token revoked meanwhile lets no more calls in.
        user = MCPToken.objects.authenticate(raw)
        return None if user is None or user.pk != user_pk else user_pk

    server = build_server(user_of)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(serve())


def handle_tokens(command: BaseCommand, options: dict[str, Any]) -> None:
    action = options["action"]
    if action == "create":
        user = _user(options["username"])
        token, raw = MCPToken.objects.issue(user, name=options["name"])
        command.stdout.write(f"Token for {user} (shown once; keep it secret):")
        command.stdout.write(raw)
    elif action == "list":
        rows = MCPToken.objects.select_related("user")
        if options["user"]:
            rows = rows.filter(user=_user(options["user"]))
        for token in rows:
            used = (
                token.last_used_at.isoformat(timespec="seconds") if token.last_used_at else "never"
            )
            command.stdout.write(f"{token.shown}…  {token.user}  {token.name or '-'}  used {used}")
    else:
        given = options["starts_with"].rstrip("…")
        # The whole token names itself; its first characters name the one that starts so.
        found = MCPToken.objects.filter(
            **({"digest": digest(given)} if len(given) > SHOWN else {"shown__startswith": given})
        )
        count = found.count()
        if count != 1:
            raise CommandError(
                f"{count} tokens start with {options['starts_with']!r}: give enough to name one."
            )
        found.delete()
        command.stdout.write(f"Revoked {options['starts_with']}….")


def _user(username: str) -> Any:
    model = get_user_model()
    try:
        return model._default_manager.get_by_natural_key(username)
    except model.DoesNotExist as exc:
        raise CommandError(f"No user {username!r}.") from exc
