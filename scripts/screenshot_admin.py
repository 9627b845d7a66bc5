"""Take the screenshot of a chat's admin timeline shown in docs/admin.md.

    .venv/bin/python scripts/screenshot_admin.py [--out docs/images/admin-timeline.png]

Not a test. In a throwaway SQLite database it migrates the example project, runs
``manage.py agentloop demo`` (offline), adds a superuser, starts ``runserver``, logs in
with Playwright driving Debian's Chromium (``apt-get install chromium``; the Python
package ``playwright``, no ``playwright install``) and saves the chat's change page.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
USERNAME, PASSWORD, EMAIL = "admin", "admin-screenshot", "admin@example.com"


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(url: str, server: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("runserver exited before answering")
        try:
            urllib.request.urlopen(url, timeout=1)  # noqa: S310 - our own local server
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"runserver did not answer at {url} within {timeout} s")


def screenshot(base_url: str, chat_pk: int, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            change = f"/admin/agentloop/chat/{chat_pk}/change/"
            page.goto(f"{base_url}/admin/login/?next={change}")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(f"{base_url}{change}")
            page.wait_for_selector(".agentloop-timeline")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images/admin-timeline.png")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentloop-screenshot-") as scratch:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DATABASE_URL": f"sqlite:///{Path(scratch) / 'db.sqlite3'}",
            "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
        }
        manage(env, "migrate", "--noinput")
        manage(env, "createsuperuser", "--noinput", "--username", USERNAME, "--email", EMAIL)
        demo = manage(env, "agentloop", "demo")
        found = re.search(r"/admin/agentloop/chat/(\d+)/change/", demo)
        if found is None:
            raise SystemExit(f"the demo printed no admin link:\n{demo}")
        port = free_port()
        server = subprocess.Popen(  # noqa: S603 - fixed arguments
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_until_up(f"{base_url}/admin/login/", server)
            screenshot(base_url, int(found.group(1)), options.out)
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"Saved {options.out}")


if __name__ == "__main__":
    main()
