"""The Celery app of the tests: ``celery -A tests.celery_app worker`` runs agentloop's tasks.

Configured like a project's ``celery.py`` (settings from ``CELERY_*`` Django settings),
then pointed at the test run's broker and queue from the environment:

* ``AGENTLOOP_TEST_BROKER_URL``: default database 15 of the suite's Redis (tests/redis_urls.py);
* ``AGENTLOOP_TEST_QUEUE``: the queue the test publishes to and the worker consumes, unique
  per test, so messages left by another test or run never reach this worker;
* ``AGENTLOOP_TEST_WORKER_READY``: a file the worker creates once it consumes;
* ``AGENTLOOP_TEST_SPANS``: a file each worker process appends its finished OpenTelemetry
  spans to, as JSON lines (tests/span_files.py; the tracing tests read it);
* ``AGENTLOOP_TEST_CLOCK_OFFSET``: seconds this worker's wall clock runs ahead (negative:
  behind), with time-machine, for the fault suite's skewed-clock scenarios;
* ``AGENTLOOP_TEST_KILL_POINTS``: a folder of kill points a test arms (tests/kill_points.py):
  the worker's processes stop there, to be killed;
* ``AGENTLOOP_TEST_QUEUE_FILE``: a file naming the queue the worker's own jobs go to, read at
  each send: a worker kept between tests (tests/workers.py ``Pool``) is moved from one test's
  queue to the next, and the jobs it sends follow it.

The visibility timeout is short (5 s) and unacked messages are swept every second, so a job
whose worker was killed with SIGKILL (``acks_late``: never acknowledged) is delivered again
within seconds, not the Redis transport's default hour. The sweep's lock (one per Redis
database, taken for a few milliseconds each second by every worker) expires after 2 s, not
kombu's 5 minutes: the suite SIGKILLs its workers at every test's end, and a kill inside the
sweep would leave the lock held, so no worker would deliver a dead one's job again for the
next 5 minutes of tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_ready

from tests.redis_urls import redis_url

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

if os.environ.get("AGENTLOOP_TEST_CLOCK_OFFSET"):
    # Imported only here: only a skewed worker needs time-machine. Started before the
    # worker forks its pool, so every process of this worker has the same skewed clock.
    import time

    import time_machine

    time_machine.travel(
        time.time() + float(os.environ["AGENTLOOP_TEST_CLOCK_OFFSET"]), tick=True
    ).start()

DEFAULT_BROKER_URL = redis_url(15)
VISIBILITY_TIMEOUT = 5

app = Celery("agentloop_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    broker_url=os.environ.get("AGENTLOOP_TEST_BROKER_URL", DEFAULT_BROKER_URL),
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,  # as docs/background.md advises: never give up
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": 2,
    },
    task_default_queue=os.environ.get("AGENTLOOP_TEST_QUEUE", "agentloop-tests"),
    task_ignore_result=True,
    # One message at a time per worker process: a second job goes to another worker.
    worker_prefetch_multiplier=1,
    worker_send_task_events=False,
    include=["agentloop.tasks"],
)


def _route_to_current_queue(name: str, args: Any, kwargs: Any, options: Any, **kw: Any) -> Any:
    path = os.environ.get("AGENTLOOP_TEST_QUEUE_FILE")
    return {"queue": Path(path).read_text()} if path else None


app.conf.task_routes = (_route_to_current_queue,)


@worker_ready.connect
def _announce_ready(**kwargs: Any) -> None:
    path = os.environ.get("AGENTLOOP_TEST_WORKER_READY")
    if path:
        Path(path).touch()


@worker_process_init.connect
def _stop_at_kill_points(**kwargs: Any) -> None:
    if os.environ.get("AGENTLOOP_TEST_KILL_POINTS"):
        # Function-local: it patches agentloop's code, once Django is set up.
        from tests.kill_points import install

        install()


@worker_process_init.connect
def _export_spans(**kwargs: Any) -> None:
    path = os.environ.get("AGENTLOOP_TEST_SPANS")
    if path:
        # Function-local: only the tracing tests' workers load the OpenTelemetry SDK.
        from tests.span_files import export_to_file

        export_to_file(path)
