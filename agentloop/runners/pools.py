"""Celery's worker pools and the database connections their jobs share.

Celery's Django fixup closes the connections of the thread that ran a task after it, unless
``CELERY_DB_REUSE_MAX`` is set; with Django's connection pool that close is the check-in.
With it set, every thread (or greenlet) of a ``threads`` or ``gevent`` worker keeps its
pooled connection between jobs, so once more jobs have run at once than the pool's
``max_size``, the others wait for a connection until the pool's timeout and their leases
can't be renewed. ``manage.py check`` refuses that when the settings name the pool
(agentloop.E020); a pool given on the worker's command line (``-P threads``) is seen only by
the worker, which says so at its start (``agentloop.tasks``). Nothing here imports Celery.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register

from ..conf import agentloop_settings

__all__ = ["SHARED_POOLS", "check_database_reuse", "pool_module", "starving_reuse"]

#: Celery's worker pools that run many jobs at once in one process (threads, greenlets): their
#: jobs share the process's database connection pool. Their names, by module.
SHARED_POOLS = {
    "celery.concurrency.thread": "threads",
    "celery.concurrency.gevent": "gevent",
    "celery.concurrency.eventlet": "eventlet",
}
#: the modules of Celery's pool aliases (``-P threads``, ``CELERY_WORKER_POOL``).
_ALIASES = {
    "prefork": "celery.concurrency.prefork",
    "processes": "celery.concurrency.prefork",
    "solo": "celery.concurrency.solo",
    "threads": "celery.concurrency.thread",
    "gevent": "celery.concurrency.gevent",
    "eventlet": "celery.concurrency.eventlet",
}


def pool_module(pool: Any) -> str:
    """The module of a Celery worker pool given by alias ("threads"), path or class."""
    if isinstance(pool, str):
        return _ALIASES.get(pool) or pool.partition(":")[0]
    return str(getattr(pool, "__module__", ""))


def starving_reuse(pool: Any, conf: Any) -> str:
    """Why a worker with Celery's pool ``pool`` and Celery's configuration ``conf`` runs
    Django's connection pool dry (one line), or "" when it doesn't."""
    if pool_module(pool) not in SHARED_POOLS or not conf.get("CELERY_DB_REUSE_MAX"):
        return ""
    pooled = [
        alias
        for alias, database in settings.DATABASES.items()
        if (database.get("OPTIONS") or {}).get("pool")
    ]
    if not pooled:
        return ""
    name = SHARED_POOLS[pool_module(pool)]
    return (
        f"CELERY_DB_REUSE_MAX with Django's connection pool (DATABASES[{pooled[0]!r}]) on a "
        f"{name} worker: each of its threads keeps a pooled connection between jobs, so the "
        "pool runs dry once more jobs have run at once than its max_size, and steps wait for "
        "a connection until they lose their leases."
    )


@register(Tags.compatibility)
def check_database_reuse(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``CELERY_DB_REUSE_MAX`` with Django's connection pool on a ``threads`` or ``gevent``
    worker named in the settings (``CELERY_WORKER_POOL``) runs the pool dry (agentloop.E020)."""
    runner = agentloop_settings.RUNNER
    chosen = agentloop_settings.BACKGROUND if runner == "auto" else runner
    if chosen in ("embedded", "django_tasks"):
        return []
    try:
        from celery import current_app  # local: Celery is an optional dependency
    except ImportError:
        return []
    conf = current_app.conf
    problem = starving_reuse(conf.worker_pool, conf) if conf.broker_url else ""
    if not problem:
        return []
    return [
        Error(
            problem,
            hint="Don't set CELERY_DB_REUSE_MAX for threads or gevent workers: with Django's "
            "pool, Celery's close after each job gives the connection back to the pool. Keep "
            'it for prefork workers (see "Choosing a pool" in "Running at scale").',
            id="agentloop.E020",
        )
    ]
