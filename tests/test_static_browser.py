"""The admin under uvicorn, served by docs/install.md's own ``mysite/asgi.py``: styled (issue 26).

uvicorn serves no static files; the install page's asgi.py wraps the application in Django's
``ASGIStaticFilesHandler`` while ``DEBUG`` is on. These tests write that block, as the page
gives it, into a ``mysite`` package of their own, serve it with uvicorn on the test database
(``DJANGO_SETTINGS_MODULE`` is already ``tests.settings``, so its ``setdefault`` keeps it), and
open a chat's change page in Chromium: the admin's ``base.css`` and agentloop's
``timeline.css`` must load and apply. With ``DEBUG`` off the same file serves none of them
(the production case the page sends to ``collectstatic``).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentloop.models import Chat, Message
from tests.browsers import TIMEOUT_MS, Server, free_port
from tests.doc_blocks import INSTALL_PAGE, site_files

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    # tests/conftest.py: skip without Chromium/Playwright; the ORM between page actions
    pytest.mark.usefixtures("browser_available", "orm_next_to_playwright"),
]


def install_page_asgi(folder: Path) -> Path:
    """``folder/mysite/asgi.py`` with the install page's block, verbatim; returns ``folder``."""
    (code,) = [code for name, code, _ in site_files(INSTALL_PAGE.read_text()) if name == "asgi.py"]
    package = folder / "mysite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "asgi.py").write_text(code)
    return folder


def serve(folder: Path, log: Path, *, debug: bool) -> Server:
    pytest.importorskip("uvicorn", reason="uvicorn is a dev dependency (pip install -e '.[dev]')")
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "mysite.asgi:application", "--app-dir", str(folder),
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    return Server(command, port, log, env={"AGENTLOOP_TEST_DEBUG": "1" if debug else "0"})


@pytest.fixture
def asgi_site(django_db_blocker, tmp_path) -> Iterator[Server]:
    """uvicorn serving the install page's asgi.py with DEBUG on."""
    with django_db_blocker.unblock():
        server = serve(install_page_asgi(tmp_path / "app"), tmp_path / "uvicorn.log", debug=True)
    yield server
    server.stop()


STYLES = """() => {
  const sheet = end => [...document.styleSheets].find(s => (s.href || '').endsWith(end));
  const rules = s => { try { return s ? s.cssRules.length : -1; } catch (e) { return -2; } };
  const timeline = document.querySelector('.agentloop-timeline');
  return {
    base: rules(sheet('/admin/css/base.css')),
    timeline: rules(sheet('/agentloop/admin/timeline.css')),
    headerDisplay: getComputedStyle(document.querySelector('#header')).display,
    timelinePadding: timeline ? getComputedStyle(timeline).paddingBottom : null,
  };
}"""


def test_the_chat_change_page_under_uvicorn_is_styled(
    browser,  # noqa: F811 - the imported fixture
    asgi_site,
    django_user_model,
):
    django_user_model.objects.create_superuser(username="root", password="pw")
    chat = Chat.objects.create(title="Styled", model="offline:any")
    Message.objects.create(chat=chat, role="user", content="Are you there?")
    Message.objects.create(chat=chat, role="assistant", content="Heard: Are you there?")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    change_page = f"/admin/agentloop/chat/{chat.pk}/change/"
    try:
        page.goto(f"{asgi_site.url}/admin/login/?next={change_page}")
        page.fill("input[name=username]", "root")
        page.fill("input[name=password]", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"{asgi_site.url}{change_page}")
        page.wait_for_load_state("load")
        styles = page.evaluate(STYLES)
    finally:
        context.close()

    assert failed == [], asgi_site.output()
    assert styles["base"] > 0, styles  # loaded and parsed as a stylesheet (a 404 is neither)
    assert styles["timeline"] > 0, styles
    assert styles["headerDisplay"] == "flex", styles  # base.css: #header { display: flex }
    assert styles["timelinePadding"] == "8px", styles  # timeline.css: .agentloop-timeline


def test_without_debug_the_install_page_asgi_serves_no_static_files(django_db_blocker, tmp_path):
    with django_db_blocker.unblock():
        server = serve(install_page_asgi(tmp_path / "app"), tmp_path / "uvicorn.log", debug=False)
    try:
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"{server.url}/static/admin/css/base.css", timeout=10)  # noqa: S310
        error.value.close()  # the 404's response, read no further
    finally:
        server.stop()

    assert error.value.code == 404
