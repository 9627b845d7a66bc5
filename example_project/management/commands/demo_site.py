"""``manage.py demo_site``: migrate, make the demo login, and serve the example site.

Background steps run on agentloop's embedded thread pool inside the server process,
so nothing else (no Redis, no Celery worker) needs to run.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

USERNAME = "demo"
PASSWORD = "demo"


class Command(BaseCommand):
    help = (
        "Migrate the database, create the user demo (password demo) if missing, and run the "
        "example site with runserver (no reloader)."
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
        call_command("migrate", interactive=False, verbosity=0)
        user_model = get_user_model()
        if not user_model.objects.filter(username=USERNAME).exists():
            user_model.objects.create_user(username=USERNAME, password=PASSWORD)
            self.stdout.write(f"Created the user {USERNAME!r}.")
        url = f"http://127.0.0.1:{port}/"
        self.stdout.write(
            self.style.SUCCESS(f"The example site: {url}  (log in as {USERNAME} / {PASSWORD})")
        )
        self.stdout.flush()
        # Without the reloader: a reloaded child would run the steps above again. Static
        # files are served even with DEBUG off (this is a demo, not a deployment).
        call_command(
            "runserver",
            f"127.0.0.1:{port}",
            use_reloader=False,
            insecure_serving=True,
            skip_checks=False,
        )
