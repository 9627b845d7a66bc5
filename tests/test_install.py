"""The wheel, installed as a new user would, answers a chat on a real Celery worker (issue 12).

One test, the path of docs/install.md end to end: ``python -m build`` (sdist, then the wheel
from it), a fresh virtualenv with only ``django-agentloop[celery,postgres]``, a
``django-admin startproject mysite`` site given exactly the code blocks of docs/install.md,
``migrate`` on a new PostgreSQL database, a ``celery -A mysite worker`` from that virtualenv
(Redis broker, a queue of its own), and the page's "Check it" run in ``manage.py shell``: a
chat answered by the offline model, then one where that model calls the page's own tool
(``mysite/tools.py``) on the worker. Then one chat of the test's own, sent with
``complete_later()``: its answer rows must appear in the database. The site's model and tool are
tests/install_site/offline.py, named in its settings (no network, no key).

It runs on the PostgreSQL run of ``make test`` (skipped on SQLite). pip reaches the package
index and keeps its usual cache, so later runs download nothing. Without Redis, or when the
build can't get its build dependencies, it is skipped, except under ``CI=true``, where that
fails the run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dj_database_url
import pytest

from tests.doc_blocks import INSTALL_PAGE, blocks_of, site_files
from tests.redis_urls import redis_url

ROOT = Path(__file__).resolve().parent.parent
SITE_CODE = Path(__file__).resolve().parent / "install_site" / "offline.py"
REDIS_URL = os.environ.get("AGENTLOOP_TEST_REDIS_URL", redis_url(15))
IN_CI = os.environ.get("CI") == "true"
DEADLINE = 120.0  # seconds the worker may take to answer
#: what a fresh user's environment must not carry over from the test run.
_FOREIGN_ENV = (
    "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL", "CELERY_BROKER_URL",
    "OPENAI_API_KEY", "AGENTLOOP_TEST_DB_NAME",
)  # fmt: skip

pytestmark = [pytest.mark.subprocess, pytest.mark.install, pytest.mark.timeout(900)]


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}; under CI=true the install test must run")
    pytest.skip(reason)


def _run(command: list[Any], *, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(  # noqa: S603 - our own interpreters and scripts
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    """The output of a command that must succeed; the whole output when it did not."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(result.args)} failed:\n{output}"
    return output


def test_the_install_page_gives_settings_urls_the_celery_app_and_its_import():
    files = site_files(INSTALL_PAGE.read_text())

    assert [(name, append) for name, _, append in files] == [
        ("settings.py", True),
        ("urls.py", True),
        ("celery.py", False),
        ("__init__.py", False),
        ("asgi.py", False),  # static files under uvicorn
        ("settings.py", True),  # "Check it": the offline model
        ("tools.py", False),  # "Check it": a tool of one's own, called by the offline model
    ]
    settings_code = files[0][1]
    for needed in ("CELERY_BEAT_SCHEDULE = beat_schedule()", "CELERY_BROKER_URL"):
        assert needed in settings_code


def check_it_shell_code(page: str) -> list[str]:
    """The shell examples of the page's "Check it", in order: the Python blocks after that
    heading that are no file of the site (the first also runs in the docs test)."""
    check_it = page[page.index("\n## Check it\n") :]
    return [
        block.code
        for block in blocks_of(check_it)
        if block.language == "python" and not block.code.startswith("# mysite/")
    ]


def test_the_check_it_model_is_the_one_the_docs_test_runs_the_page_with():
    from tests import settings as test_settings

    page = INSTALL_PAGE.read_text()
    *_, (name, code, _) = [f for f in site_files(page) if f[0] == "settings.py"]
    namespace: dict[str, Any] = {"AGENTLOOP": {}}
    exec(code, namespace)  # noqa: S102 - the page's own settings block

    assert name == "settings.py"
    assert (
        namespace["AGENTLOOP"]["PROVIDERS"]["offline"]
        == (test_settings.AGENTLOOP["PROVIDERS"]["offline"])
    )
    text_only, with_tool = check_it_shell_code(page)
    assert "offline:" in text_only
    assert [b.code for b in blocks_of(page) if b.language == "python" and b.runs] == [text_only]
    assert "from mysite.tools import add" in with_tool  # run by the install test only


# -- the services ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def postgres() -> dict[str, Any]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.skip("runs on the PostgreSQL run of make test (DATABASE_URL=postgres://...)")
    return dict(dj_database_url.parse(url))


@pytest.fixture(scope="module")
def redis_available() -> None:
    try:
        import redis  # local: the celery extra; its absence is reported below
    except ImportError:
        _unavailable("the redis client is not installed (pip install -e '.[celery]')")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable(f"Redis does not answer at {REDIS_URL}: {exc}")


@pytest.fixture
def fresh_database(postgres: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A new, empty PostgreSQL database (dropped afterwards), as Django settings."""
    import psycopg  # local: the postgres extra, present only on the PostgreSQL run
    from psycopg import sql

    name = f"agentloop_install_{uuid.uuid4().hex[:10]}"
    server = {
        "host": postgres.get("HOST") or None, "port": postgres.get("PORT") or None,
        "user": postgres.get("USER") or None, "password": postgres.get("PASSWORD") or None,
    }  # fmt: skip
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield {**postgres, "NAME": name, "TEST": {}}
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))  # fmt: skip


# -- the wheel and the virtualenv ----------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist, then the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    result = _run([sys.executable, "-m", "build", "--outdir", out, ROOT])
    if result.returncode != 0:
        last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
        _unavailable(f"python -m build could not run: {' | '.join(last)}")
    (built,) = out.glob("django_agentloop-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the wheel and only its celery and postgres extras."""
    path = tmp_path_factory.mktemp("venv")
    _ok(_run([sys.executable, "-m", "venv", path]))
    _ok(_run([path / "bin" / "python", "-m", "pip", "install", f"{wheel}[celery,postgres]"]))
    return path


def site_env(venv: Path) -> dict[str, str]:
    """A user's shell with the virtualenv activated: nothing of the test run's settings."""
    env = {key: value for key, value in os.environ.items() if key not in _FOREIGN_ENV}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_site_file(site: Path, name: str, code: str, *, append: bool) -> None:
    path = site / "mysite" / name
    if append:
        path.write_text(path.read_text() + "\n\n" + code)
    else:
        path.write_text(code)


def test_the_wheel_carries_templates_static_files_migrations_and_the_model_catalog(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    for needed in (
        "agentloop/providers/models.json",
        "agentloop/migrations/0001_initial.py",
        "agentloop/templates/admin/agentloop/chat/timeline.html",
        "agentloop/templates/agentloop/chat_react.html",  # docs/frontends.md renders it
        "agentloop/static/agentloop/admin/timeline.css",
        "agentloop/py.typed",
    ):
        assert needed in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_a_startproject_site_set_up_per_the_install_page_answers_on_a_celery_worker(
    venv, fresh_database, redis_available, tmp_path
):
    env = site_env(venv)
    python = venv / "bin" / "python"
    site = tmp_path / "site"
    site.mkdir()
    _ok(_run([venv / "bin" / "django-admin", "startproject", "mysite", site], env=env))
    files = site_files(INSTALL_PAGE.read_text())
    init_code = next(code for name, code, _ in files if name == "__init__.py")

    # Every block of the page but the __init__.py import, then this test's own lines.
    for name, code, append in files:
        if name != "__init__.py":
            write_site_file(site, name, code, append=append)
    queue = f"install-{uuid.uuid4().hex[:8]}"
    write_site_file(site, "settings.py", append=True, code=(
        "# The test's own lines: its database, broker and queue.\n"
        f"DATABASES = {{'default': {fresh_database!r}}}\n"
        f"CELERY_BROKER_URL = {REDIS_URL!r}\n"
        f"CELERY_TASK_DEFAULT_QUEUE = {queue!r}\n"
    ))  # fmt: skip
    manage = [python, site / "manage.py"]

    # migrate: no key warning (the page's DEFAULT_MODEL is OpenAI's, and no key is set).
    migrated = _ok(_run([*manage, "migrate", "--noinput"], cwd=site, env=env))
    assert "Applying agentloop.0001_initial... OK" in migrated
    assert "agentloop.W002" not in migrated
    # check, before the Celery app is imported in __init__.py: both warnings, with the fix.
    checked = _ok(_run([*manage, "check"], cwd=site, env=env))
    assert "agentloop.W002" in checked
    assert "agentloop.W003" in checked
    assert "from .celery import app as celery_app" in checked

    write_site_file(site, "__init__.py", init_code, append=False)
    shutil.copy(SITE_CODE, site / "mysite" / "offline.py")
    write_site_file(site, "settings.py", append=True, code=(
        "# The test's own model with a tool (tests/install_site/offline.py), from settings.\n"
        'AGENTLOOP["DEFAULT_MODEL"] = "install:scripted"\n'
        'AGENTLOOP["PROVIDERS"]["install"] = {"class": "mysite.offline.OfflineProvider"}\n'
        f'AGENTLOOP["REDIS_URL"] = {REDIS_URL!r}\n'
    ))  # fmt: skip
    checked = _ok(_run([*manage, "check"], cwd=site, env=env))
    assert "agentloop." not in checked, checked

    log = tmp_path / "worker.log"
    worker = start_worker(venv, site, env, queue, log)
    try:
        # The page's "Check it": the shell enqueues, the worker answers with the offline model,
        # then calls the page's own tool (mysite/tools.py) by the offline model's rules.
        for shell_code in check_it_shell_code(INSTALL_PAGE.read_text()):
            _ok(_run([*manage, "shell", "-c", shell_code], cwd=site, env=env, timeout=60))
        started = _ok(_run([*manage, "shell", "-c", (
            "from agentloop.models import Chat\n"
            "from mysite.offline import add\n"
            "chat = Chat.objects.create(title='install').with_tools(add)\n"
            "chat.ask_later('What is 2 + 40?')\n"
            "chat.complete_later()\n"
            "print('CHAT', chat.pk)\n"
        )], cwd=site, env=env))  # fmt: skip
        chat_id = int(re.search(r"^CHAT (\d+)$", started, re.MULTILINE)[1])  # type: ignore[index]
        rows = wait_for_answer(fresh_database, chat_id, worker, log)
    finally:
        stop(worker)

    assert rows == [
        ("user", "What is 2 + 40?"),
        ("assistant", ""),
        ("tool", "42"),
        ("assistant", "2 + 40 = 42."),
    ]
    # The worker ran the steps: the shell only enqueued them (no in-process fallback).
    worker_log = log.read_text()
    assert worker_log.count("Task agentloop.step_chat[") >= 4, worker_log  # 1 + 3 steps
    assert "succeeded in" in worker_log


# -- the worker and the answer --------------------------------------------------------------------
def start_worker(venv: Path, site: Path, env: dict[str, str], queue: str, log: Path):
    command = [
        venv / "bin" / "celery", "-A", "mysite", "worker", "--loglevel=INFO", "--concurrency=1",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "-Q", queue,
        "-n", f"{queue}@%h",
    ]  # fmt: skip
    with log.open("w") as output:
        return subprocess.Popen(  # noqa: S603 - the virtualenv's own celery
            [str(part) for part in command], cwd=site, env=env, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def stop(worker: subprocess.Popen) -> None:
    """End the worker's process group (its main process and its pool child); SIGKILL if slow."""
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        if worker.poll() is not None:
            return
        os.killpg(worker.pid, signal_number)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=30)


def wait_for_answer(database: dict[str, Any], chat_id: int, worker: Any, log: Path):
    """The chat's (role, content) rows once it is idle; fails on a timeout or a dead worker."""
    import psycopg  # local: the postgres extra, present only on the PostgreSQL run

    connection = {
        "host": database.get("HOST") or None, "port": database.get("PORT") or None,
        "user": database.get("USER") or None, "password": database.get("PASSWORD") or None,
        "dbname": database["NAME"],
    }  # fmt: skip
    deadline = time.monotonic() + DEADLINE
    with psycopg.connect(autocommit=True, **connection) as db:
        while True:
            (state, error) = db.execute(
                "SELECT state, error FROM agentloop_chat WHERE id = %s", (chat_id,)
            ).fetchone()  # type: ignore[misc]
            if state in ("idle", "failed", "stopped"):
                break
            assert worker.poll() is None, f"the worker died:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"chat still {state}:\n{log.read_text()}"
            time.sleep(0.2)
        assert (state, error) == ("idle", ""), log.read_text()
        return db.execute(
            "SELECT role, content FROM agentloop_message WHERE chat_id = %s ORDER BY id",
            (chat_id,),
        ).fetchall()
