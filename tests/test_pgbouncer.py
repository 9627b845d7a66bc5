"""Behind a real pgbouncer in transaction mode (docs/background.md, "Running at scale").

pgbouncer before 1.21 (Debian 12 ships 1.18) doesn't keep prepared statements per client: a
server connection holds what whichever client prepared on it. With one server connection
and two worker processes one after the other, the second prepares its first statement
under a name the first left there ("prepared statement "_pg3_0" already exists"). agentloop
prepares its per-step statements by default; the second worker must warn once, go on
unprepared, and lose no job.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connection

from agentloop.models import Chat
from tests.processes import run_script, summary

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="pgbouncer: PostgreSQL"),
    pytest.mark.skipif(
        not os.path.exists(PGBOUNCER) and os.environ.get("CI") != "true",
        reason="pgbouncer is not installed (apt-get install pgbouncer)",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def pgbouncer():
    """A pgbouncer in transaction mode with ONE server connection, in front of the test
    database's server; its port."""
    settings = connection.settings_dict
    port = _free_port()
    # Not under pytest's tmp_path (mode 700): run as root, pgbouncer runs as another user.
    home = Path(tempfile.mkdtemp(prefix="agentloop-pgbouncer-"))
    user = settings["USER"] or "postgres"
    (home / "users.txt").write_text(f'"{user}" ""\n')
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={settings['HOST'] or '127.0.0.1'} port={settings['PORT'] or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {home / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 20\n"
        f"logfile = {home / 'pgbouncer.log'}\npidfile = {home / 'pgbouncer.pid'}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    command = [PGBOUNCER, str(home / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # pgbouncer refuses to run as root: as the database's OS user instead.
        home.chmod(0o777)
        command[1:1] = ["-u", "postgres"]
    output = (home / "output.txt").open("w")
    process = subprocess.Popen(  # noqa: S603 - a fixed binary and our own config
        command, stdout=output, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                output.close()
                log = home / "pgbouncer.log"
                said = (home / "output.txt").read_text() + (log.read_text() if log.exists() else "")
                shutil.rmtree(home, ignore_errors=True)
                raise AssertionError(f"pgbouncer did not start: {said}") from None
            time.sleep(0.05)
    try:
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)
        output.close()
        shutil.rmtree(home, ignore_errors=True)


def _version() -> str:
    done = subprocess.run(  # noqa: S603 - a fixed binary
        [PGBOUNCER, "--version"], capture_output=True, text=True, check=False
    )
    return (done.stdout or done.stderr).strip()


def test_workers_behind_pgbouncer_in_transaction_mode_lose_no_job(user, pgbouncer):
    settings = connection.settings_dict
    url = f"postgres://{settings['USER'] or 'postgres'}@127.0.0.1:{pgbouncer}/{settings['NAME']}"
    chats = {}
    for worker in ("first", "second"):
        chats[worker] = []
        for index in range(3):
            chat = Chat.objects.create(model="pooled:test", owner=user)
            chat.ask_later(f"{worker} {index}")
            # Queued as complete_later() leaves it, with no job here: the workers run them.
            Chat.objects.filter(pk=chat.pk).update(state="queued")
            chats[worker].append(chat)

    outputs = {}
    for worker, its in chats.items():
        done = run_script("pooled_jobs.py", *[chat.pk for chat in its], env={"DATABASE_URL": url})
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[worker] = summary(done.stdout)

    for worker, its in chats.items():
        assert outputs[worker]["actions"] == {str(chat.pk): ["done"] for chat in its}
        for index, chat in enumerate(its):
            chat.refresh_from_db()
            assert (chat.state, chat.lease_token) == ("idle", "")
            assert [m.content for m in chat.messages.order_by("id")] == [
                f"{worker} {index}",
                f"echo: {worker} {index}",
            ]
    # The first worker prepared its statements on the one server connection; the second met
    # them there, warned once and went on unprepared.
    assert outputs["first"]["warnings"] == []
    warnings = outputs["second"]["warnings"]
    assert len(warnings) == 1, (_version(), warnings)
    assert "prepared statement" in warnings[0] and "already exists" in warnings[0]
    assert 'AGENTLOOP["PREPARED_STATEMENTS"] = False' in warnings[0]
