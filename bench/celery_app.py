"""The Celery app of the background benchmarks: ``celery -A bench.celery_app worker``.

The same three lines as a project's ``celery.py`` (see docs/background.md). When
``$BENCH_CANCEL_LOG`` names a file, each cancelled run appends ``<chat pk> <monotonic time>``
to it as it stops, so bench/cancel_latency.py can time a cancel across processes; the worker
creates ``$BENCH_WORKER_READY`` once it consumes. ``bench.hop`` is the Celery floor of
bench/celery_throughput.py: an empty task that re-enqueues itself; ``bench.paced_hop`` is
bench/in_flight.py's: a chat's three jobs with nothing of agentloop's but the waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.background_settings")

app = Celery("agentloop_bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _log_cancel(*, chat: Any, **kwargs: Any) -> None:
    # CLOCK_MONOTONIC is system-wide on Linux: comparable with the benchmark process's clock.
    stopped = time.monotonic()
    with open(os.environ["BENCH_CANCEL_LOG"], "a") as log:
        log.write(f"{chat.pk} {stopped}\n")


if os.environ.get("BENCH_CANCEL_LOG"):
    from agentloop.signals import chat_cancelled

    chat_cancelled.connect(_log_cancel, dispatch_uid="bench-cancel-log")


@worker_ready.connect
def _announce_ready(**kwargs: Any) -> None:
    if os.environ.get("BENCH_WORKER_READY"):
        Path(os.environ["BENCH_WORKER_READY"]).touch()


if os.environ.get("BENCH_PROFILE"):
    # cProfile of the worker's main thread from ready to shutdown, written to the file it
    # names: under -P gevent every step runs on that thread (its greenlets).
    import cProfile

    _profile = cProfile.Profile()
    worker_ready.connect(lambda **kwargs: _profile.enable(), weak=False)

    @worker_shutdown.connect
    def _write_profile(**kwargs: Any) -> None:
        _profile.disable()
        _profile.dump_stats(os.environ["BENCH_PROFILE"])


@app.task(name="bench.hop", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def hop(finish_dir: str, chain: int, remaining: int) -> None:
    """Do nothing, then enqueue the next hop of this chain (agentloop.step_chat's options);
    the last hop marks its chain finished with a file in ``finish_dir``."""
    if remaining > 1:
        hop.apply_async((finish_dir, chain, remaining - 1))
    else:
        (Path(finish_dir) / str(chain)).touch()


@app.task(name="bench.paced_hop", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def paced_hop(finish_dir: str, chain: int, remaining: int, latency: float) -> None:
    """One of a chat's three jobs without agentloop (step_chat's options): the first and the
    last wait ``latency`` (its two model calls; ``time.sleep`` is gevent's under ``-P
    gevent``), each enqueues the next, the last marks its chain finished in ``finish_dir``."""
    if remaining != 2:
        time.sleep(latency)
    if remaining > 1:
        paced_hop.apply_async((finish_dir, chain, remaining - 1, latency))
    else:
        (Path(finish_dir) / str(chain)).touch()


@app.task(name="bench.library_hop", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def library_hop(finish_dir: str, chat_pk: int, remaining: int) -> None:
    """One of a chat's three jobs done with the libraries alone (bench/library_floor.py:
    psycopg's pool, httpx, redis-py), then the next enqueued as agentloop's runner does; the
    last marks its chain finished in ``finish_dir``."""
    from bench.library_floor import hop as library_job  # Django is set up by then

    library_job(chat_pk, remaining)
    if remaining > 1:
        args = (finish_dir, chat_pk, remaining - 1)
        library_hop.apply_async(args, argsrepr=repr(args), kwargsrepr="{}")
    else:
        (Path(finish_dir) / str(chat_pk)).touch()
