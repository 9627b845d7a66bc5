"""``manage.py demo_site``: what ``make demo`` runs, from a free port to the served site.

It checks the port first (a busy one is one line and exit code 1, before anything else),
migrates, makes the login ``demo`` / ``demo`` (staff, allowed to use agentloop's and the
example's admin pages), runs the offline transcript demo as that user (when
``AGENTLOOP["DEMO"]`` names one, as the example's settings do), prints the site, the demo
chat's page and its admin page, then serves.

The database is kept between runs (chats of your own stay), and it says so; each run
replaces the demo chat of the previous one (with the notes it saved), so the transcript is
the same every time and nothing of the demo is there twice. Background steps run on agentloop's
embedded thread pool inside the server process, so nothing else (no Redis, no Celery worker)
needs to run.
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.urls import reverse

from agentloop.conf import agentloop_settings
from agentloop.import_paths import load_by_path
from agentloop.models import Chat

USERNAME = "demo"
PASSWORD = "demo"
HOST = "127.0.0.1"
#: apps whose admin pages the demo user may use (view, change, delete: everything).
ADMIN_APPS = ("agentloop", "example_project")


class Command(BaseCommand):
    help = (
        "Check the port, migrate, create the user demo (password demo), run the offline demo "
        "as that user, and serve the example site with runserver (no reloader)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="Port to serve on (8000).")
        parser.add_argument(
            "--no-input",
            "--noinput",
            action="store_false",
            dest="interactive",
            help="Never prompt (for scripts; the command asks nothing otherwise either).",
        )

    def handle(self, *args: Any, port: int, interactive: bool, **options: Any) -> None:
        ensure_port_is_free(port)
        call_command("migrate", interactive=False, verbosity=0)
        created = ensure_demo_user()
        if created:
            self.stdout.write(f"Created the user {USERNAME!r}.")
        site = f"http://{HOST}:{port}"
        chat = None
        if agentloop_settings.DEMO:  # the example's settings name one; other settings may not
            replaced = delete_earlier_demo_chats()
            database = connection.settings_dict["NAME"]
            self.stdout.write(
                f"The database {database} is kept between runs (delete it to start from "
                "nothing)"
                + (f"; this run replaces the demo chat #{replaced[0]}." if replaced else ".")
            )
            # The raw stream, not self.stdout: a wrapped wrapper ends every streamed chunk a line.
            out = options.get("stdout") or sys.stdout
            call_command("agentloop", "demo", "--owner", USERNAME, "--site", site, stdout=out)
            chat = Chat.objects.filter(owner__username=USERNAME).latest("pk")
            self.stdout.write("")
        self.stdout.write(
            self.style.SUCCESS(f"The example site: {site}/  (log in as {USERNAME} / {PASSWORD})")
        )
        if chat is not None:
            self.stdout.write(f"The demo chat: {site}{reverse('chat_detail', args=[chat.pk])}")
        self.stdout.flush()
        # Without the reloader: a reloaded child would run the steps above again. Static
        # files are served even with DEBUG off (this is a demo, not a deployment).
        call_command(
            "runserver",
            f"{HOST}:{port}",
            use_reloader=False,
            insecure_serving=True,
            skip_checks=False,
        )


def ensure_port_is_free(port: int) -> None:
    """One clear line when something already listens on the port (runserver's error comes late)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As runserver binds: a port left in TIME_WAIT by a stopped server is free.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((HOST, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(
                f"Port {port} is in use: stop what serves on it, or pick another port "
                f"(make demo PORT={port + 1})."
            ) from exc
        raise CommandError(f"Can't serve on {HOST}:{port}: {exc.strerror}.") from exc
    finally:
        probe.close()


def delete_earlier_demo_chats() -> list[int]:
    """Delete the demo chats of earlier runs (the demo user's chats with the demo's title,
    their subagents' chats and the notes they saved); their ids, oldest first."""
    config = agentloop_settings.DEMO  # a dict, or its import path
    config = load_by_path(config) if isinstance(config, str) else config
    title = str(config.get("title") or "agentloop demo")
    earlier = Chat.objects.filter(owner__username=USERNAME, title=title, parent__isnull=True)
    ids = list(earlier.order_by("pk").values_list("pk", flat=True))
    if ids:
        earlier.delete()  # messages, calls, subagent chats and notes go with them (cascades)
    return ids


def ensure_demo_user() -> bool:
    """The user demo, staff with every permission on the demo's apps; True if just created."""
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=USERNAME)
    if created:
        user.set_password(PASSWORD)
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=ADMIN_APPS))
    return created
