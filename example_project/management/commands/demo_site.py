"""``manage.py demo_site``: what ``make demo`` runs, from a free port to the served site.

It checks the port first (a busy one is one line and exit code 1, before anything else),
migrates, makes the login ``demo`` / ``demo`` (staff, allowed to use agentloop's and the
example's admin pages), runs the offline transcript demo as that user (when
``AGENTLOOP["DEMO"]`` names one, as the example's settings do), prints the site, the demo
chat's page and its admin page, then serves. Background steps run on agentloop's
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
from django.urls import reverse

from agentloop.conf import agentloop_settings
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
