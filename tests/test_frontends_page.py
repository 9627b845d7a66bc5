"""docs/frontends.md, "The page", works as written in a ``startproject`` site set up per
docs/install.md.

The site is ``django-admin startproject mysite`` given the site blocks of docs/install.md, then
those of docs/frontends.md (its settings: ``STATICFILES_DIRS`` and ``LOGIN_URL``; its view and
its URL), on a SQLite database of its own, run with this checkout's interpreter (the wheel and
a fresh virtualenv are tests/test_install.py's; a real worker answering is
tests/test_usechat_browser.py's). The page's build step is the React page built from
frontends/usechat with npm (tests/frontend_build.py), its ``dist/`` placed where the page puts
it (``frontend/dist`` beside ``manage.py``). Then ``findstatic`` must find the build under
``usechat/``, and a Django test client in ``manage.py shell`` opens the page: a visitor who
isn't logged in goes to ``LOGIN_URL``, the owner gets the shell template agentloop ships with
the chat's pk, agentloop's URLs and the built files, and another user gets 404.

Skipped without node and npm (needed for the build), except under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import INSTALL_PAGE, ROOT, blocks_of, site_files
from tests.frontend_build import build, node_missing, skip_or_fail

PAGE = ROOT / "docs" / "frontends.md"
#: what a user's shell must not carry over from the test run.
_FOREIGN_ENV = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "CELERY_BROKER_URL")

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(600)]

#: the visit, run in the site's ``manage.py shell``: prints one JSON line of what it saw.
VISIT = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
from agentloop.models import Chat

setup_test_environment()  # the client's host, testserver, is then allowed

users = get_user_model().objects
ada = users.create_user("ada", password="pw")
bob = users.create_user("bob", password="pw")
chat = Chat.objects.create(owner=ada, title="Ada's chat")
url = f"/chats/{chat.pk}/"

anonymous = Client().get(url)
owner = Client()
owner.force_login(ada)
page = owner.get(url)
other = Client()
other.force_login(bob)
print("VISIT " + json.dumps({
    "pk": chat.pk,
    "anonymous": [anonymous.status_code, anonymous.get("Location", "")],
    "status": page.status_code,
    "html": page.content.decode(),
    "csrf_cookie": "csrftoken" in page.cookies,
    "history": owner.get(f"/agentloop/usechat/{chat.pk}/messages").json(),
    "other": other.get(url).status_code,
}))
"""


def page_site_files() -> list[tuple[str, str, bool]]:
    """The site blocks of the frontends page, in order."""
    return site_files(PAGE.read_text())


def test_the_page_gives_settings_a_view_and_its_url():
    files = page_site_files()

    assert [(name, append) for name, _, append in files] == [
        ("settings.py", True),
        ("views.py", False),
        ("urls.py", True),
    ]
    settings_code = files[0][1]
    assert 'STATICFILES_DIRS = [("usechat", BASE_DIR / "frontend" / "dist")]' in settings_code
    assert "LOGIN_URL" in settings_code
    assert '"agentloop/chat_react.html"' in files[1][1]
    assert (ROOT / "agentloop" / "templates" / "agentloop" / "chat_react.html").is_file()
    # The build step the test stands in for (it copies the same build into frontend/dist).
    # (The page's other bash block is the AG-UI client's: tests/test_ag_ui_client.py's.)
    (build_step,) = [
        b.code
        for b in blocks_of(PAGE.read_text())
        if b.language == "bash" and "npm run build" in b.code
    ]
    assert build_step.startswith("cd frontend && npm ci && npm run build")


def _run(command: list, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(  # noqa: S603 - this interpreter, in the site's folder
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{output}"
    return output


def test_a_startproject_site_serves_the_react_page_as_the_page_says(tmp_path):
    if reason := node_missing():
        skip_or_fail(reason, "the frontends page's test")
    dist = build()
    env = {key: value for key, value in os.environ.items() if key not in _FOREIGN_ENV}
    site = tmp_path / "site"
    site.mkdir()
    _run([sys.executable, "-m", "django", "startproject", "mysite", site], tmp_path, env)
    for name, code, append in [*site_files(INSTALL_PAGE.read_text()), *page_site_files()]:
        path = site / "mysite" / name
        path.write_text(path.read_text() + "\n\n" + code if append else code)
    with (site / "mysite" / "settings.py").open("a") as settings:
        settings.write(
            "\n# The test's own lines: a database of its own.\n"
            f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3',"
            f" 'NAME': {str(tmp_path / 'db.sqlite3')!r}}}}}\n"
        )
    # The page's build step: frontend/dist beside manage.py holds npm run build's output.
    shutil.copytree(dist, site / "frontend" / "dist")
    manage = [sys.executable, site / "manage.py"]

    _run([*manage, "migrate", "--noinput"], site, env)
    found = _run([*manage, "findstatic", "usechat/usechat.js", "usechat/usechat.css"], site, env)
    assert str(site / "frontend" / "dist" / "usechat.js") in found
    assert str(site / "frontend" / "dist" / "usechat.css") in found
    output = _run([*manage, "shell", "-c", VISIT], site, env)
    (line,) = re.findall(r"^VISIT (.*)$", output, re.MULTILINE)
    seen = json.loads(line)

    pk = seen["pk"]
    assert seen["anonymous"] == [302, f"/admin/login/?next=/chats/{pk}/"]
    assert seen["status"] == 200
    root = re.search(r'<div id="root"([^>]*)>', seen["html"])
    assert root is not None, seen["html"]
    assert f'data-chat-id="{pk}"' in root[1]
    assert 'data-api="/agentloop/usechat"' in root[1]
    assert f'data-cancel-url="/agentloop/chats/{pk}/cancel/"' in root[1]
    assert '<script type="module" src="/static/usechat/usechat.js">' in seen["html"]
    assert 'href="/static/usechat/usechat.css"' in seen["html"]
    assert "<title>Ada&#x27;s chat</title>" in seen["html"]
    assert seen["csrf_cookie"]
    assert seen["history"]["messages"] == []
    assert seen["other"] == 404
