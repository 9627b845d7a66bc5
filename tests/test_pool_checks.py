"""Settings that starve Django's connection pool (issue 41, defect 15): ``CELERY_DB_REUSE_MAX``
with Django's pool on a ``threads`` or ``gevent`` worker makes every thread keep a pooled
connection between jobs, so the pool runs dry. ``manage.py check`` refuses it when the
settings name the worker's pool (agentloop.E020); a worker started with ``-P threads`` says
so in its log at start."""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings

from tests.helpers import wait_until
from tests.workers import REDIS_URL, Worker, start_worker

celery = pytest.importorskip("celery")

POOL = {"min_size": 1, "max_size": 10, "timeout": 60}


@contextmanager
def project(*, pool: bool = True, **celery_settings: Any) -> Iterator[None]:
    """A project's settings: its Celery app (made current, as its package's import would)
    with ``celery_settings`` (``CELERY_*`` names), and Django's pool on its database."""
    previous = celery.current_app._get_current_object()
    app = celery.Celery("site", set_as_current=False)
    app.config_from_object(
        SimpleNamespace(CELERY_BROKER_URL="redis://127.0.0.1:6379/0", **celery_settings),
        namespace="CELERY",
    )
    database = {**settings.DATABASES["default"]}
    if pool:
        database["OPTIONS"] = {**database.get("OPTIONS", {}), "pool": POOL}
    app.set_current()
    try:
        with warnings.catch_warnings():
            # Django warns that overriding DATABASES may surprise: only its settings are read.
            warnings.simplefilter("ignore", UserWarning)
            with override_settings(DATABASES={**settings.DATABASES, "default": database}):
                yield
    finally:
        previous.set_current()


def reuse_errors() -> list[Any]:
    return [message for message in run_checks() if message.id == "agentloop.E020"]


@pytest.mark.parametrize("worker_pool", ["threads", "gevent"])
def test_reuse_max_with_a_pool_on_a_threads_or_gevent_worker_is_an_error(worker_pool):
    with project(CELERY_WORKER_POOL=worker_pool, CELERY_DB_REUSE_MAX=1000):
        (error,) = reuse_errors()

    assert error.is_serious()
    assert f"on a {worker_pool} worker" in error.msg
    assert "DATABASES['default']" in error.msg
    assert "Don't set CELERY_DB_REUSE_MAX for threads or gevent workers" in error.hint


@pytest.mark.parametrize(
    "setup",
    [
        # the setups docs/running-at-scale.md gives, one per pool
        {"CELERY_WORKER_POOL": "threads"},
        {"CELERY_WORKER_POOL": "gevent"},
        {"CELERY_WORKER_POOL": "prefork", "CELERY_DB_REUSE_MAX": 1000},
        {"CELERY_DB_REUSE_MAX": 1000},  # prefork, Celery's default
    ],
    ids=["threads", "gevent", "prefork", "default pool"],
)
def test_the_documented_setup_of_each_pool_passes(setup):
    with project(**setup):
        assert reuse_errors() == []


def test_reuse_max_without_djangos_pool_passes_on_any_worker():
    with project(pool=False, CELERY_WORKER_POOL="threads", CELERY_DB_REUSE_MAX=1000):
        assert reuse_errors() == []


# -- a real worker: the pool it runs is known at its start ---------------------------------------
def start_threads_worker(tmp: Path, settings_module: str) -> Worker:
    """A ``celery worker -P threads -c 4`` on Django's pool (``max_size`` 2) and the settings
    module ``settings_module``, ready; the caller kills it."""
    worker, ready = start_worker(
        tmp,
        "threads",
        queue=f"agentloop-test-{uuid.uuid4().hex[:12]}",
        broker_url=REDIS_URL,
        run_log=tmp / "runs.log",
        pool="threads",
        concurrency=4,
        env={
            "DJANGO_SETTINGS_MODULE": settings_module,
            "AGENTLOOP_TEST_DB_POOL": json.dumps({"min_size": 1, "max_size": 2, "timeout": 5}),
        },
    )
    try:
        wait_until(ready.exists, "the worker to be ready", 60, worker.output)
    except BaseException:
        worker.kill()
        raise
    return worker


@pytest.mark.skipif(connection.vendor != "postgresql", reason="Django's pool: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("settings_module", "says"),
    [("tests.reuse_settings", True), ("tests.settings", False)],
    ids=["CELERY_DB_REUSE_MAX", "without it"],
)
def test_a_threads_worker_on_djangos_pool_says_at_its_start_that_reuse_max_starves_it(
    redis_client, tmp_path, settings_module, says
):
    worker = start_threads_worker(tmp_path, settings_module)
    try:
        output = worker.output()
    finally:
        worker.kill()

    line = "CELERY_DB_REUSE_MAX with Django's connection pool (DATABASES['default']) on a threads"
    assert (line in output) is says, output
    assert (
        "Remove CELERY_DB_REUSE_MAX from this worker's settings (agentloop.E020)" in output
    ) is says
