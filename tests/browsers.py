"""The browser tests' parts: Chromium (Playwright) and the test site served in a subprocess
(:class:`Server`: ``manage.py runserver`` or uvicorn on the test database), and the
screenshots the docs show. The ``browser``, ``site``, ``page`` and ``person`` fixtures of
tests/conftest.py start them; a browser test module uses ``browser_available`` and
``orm_next_to_playwright``; :func:`start_chat` and :func:`send` drive the example site."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.processes import REPO_ROOT, process_env

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
IN_CI = os.environ.get("CI") == "true"
SCREENSHOTS = REPO_ROOT / "docs" / "images"
TIMEOUT_MS = 30_000  # any one wait for the page; a failure, not a pause
SERVER_SETTINGS = {
    "DEFAULT_MODEL": "demo:rule-based",
    "BACKGROUND": "embedded",
    "PARTIAL_SAVE_INTERVAL": 0.2,
    "EVENTS_POLL_INTERVAL": 0.1,
}


def missing() -> str | None:
    """Why the browser tests can't run here (no Chromium, no Playwright), or None."""
    if not Path(CHROMIUM).exists():
        return f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(
        self,
        command: list[str],
        port: int,
        log: Path,
        settings: dict | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.url = f"http://localhost:{port}"  # a host the test settings allow
        self.port = port
        self.log = log
        agentloop_settings = json.dumps(settings or SERVER_SETTINGS)
        with log.open("w") as output:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter
                command,
                env=process_env(AGENTLOOP_TEST_SETTINGS=agentloop_settings, **(env or {})),
                cwd=REPO_ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self._wait_until_listening()

    def _wait_until_listening(self) -> None:
        import socket

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited:\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the server did not listen in time:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def runserver(log: Path, settings: dict | None = None) -> Server:
    """``manage.py runserver`` (threaded WSGI, no reloader) on a free port and the test
    database, with agentloop's ``settings`` (else :data:`SERVER_SETTINGS`)."""
    port = free_port()
    command = [
        sys.executable, "manage.py", "runserver", "--noreload", "--insecure", f"127.0.0.1:{port}",
    ]  # fmt: skip
    return Server(command, port, log, settings)


def screenshot(page, name: str, tmp_path: Path) -> Path:
    """A screenshot for the docs (with AGENTLOOP_SCREENSHOTS=1), else a throwaway one."""
    folder = SCREENSHOTS if os.environ.get("AGENTLOOP_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    return path


@contextmanager
def open_tab(browser: Any) -> Iterator[Any]:
    """A new page of ``browser`` (1000 x 900, the tests' timeouts); the test fails if the
    page raised a JavaScript error meanwhile."""
    from playwright.sync_api import expect  # local: Playwright is imported only by browser tests

    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def start_chat(page: Any, text: str) -> int:
    """On the example site's home page: a new chat with the demo assistant, asked ``text``;
    returns its id once its page follows the chat live."""
    page.fill("#new-chat textarea", text)
    page.click("#new-chat button[type=submit]")
    page.wait_for_url(re.compile(r"/chats/\d+/$"))
    page.wait_for_selector("#chat[data-live='1']")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def send(page: Any, text: str) -> None:
    """On a chat's page: send ``text`` once the form takes one (not while a call waits for
    a person), until the page shows it as the last user message."""
    from playwright.sync_api import expect  # local: Playwright is imported only by browser tests

    button = page.locator("#send button[type=submit]")
    expect(button).to_be_enabled()
    page.fill("#send textarea", text)
    button.click()
    expect(page.locator("li.msg-user .text").last).to_have_text(text)


def log_in(page: Any, site: Server, username: str, password: str) -> None:
    """Log in through the site's login form; back on its home page."""
    page.goto(f"{site.url}/accounts/login/?next=/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.url}/")
