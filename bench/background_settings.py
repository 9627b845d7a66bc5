"""Settings of the background benchmarks (the benchmark process and its Celery workers).

``bench.settings`` (PostgreSQL from ``$BENCH_DATABASE_URL``, DEBUG off) plus what a project
running agentloop under Celery sets: ``CELERY_*`` for the app in ``bench/celery_app.py`` and
``AGENTLOOP``. ``$BENCH_AGENTLOOP`` (JSON) is merged into ``AGENTLOOP``, so each worker
variant (Redis notices or not, poll interval) is chosen by the process that starts it.
"""

import json
import os
from typing import Any

from bench.settings import *  # noqa: F403

AGENTLOOP: dict[str, Any] = {
    "BACKGROUND": "celery",
    # "rules:<message>" answers at once ("tools:add") or streams ("stream:500:0.02").
    "PROVIDERS": {"rules": {"class": "tests.worker_provider.RuleProvider"}},
    **json.loads(os.environ.get("BENCH_AGENTLOOP") or "{}"),
}

CELERY_BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("BENCH_QUEUE", "agentloop-bench")
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the database connections around every task unless this is set
# (then every DB_REUSE_MAX tasks): bench/celery_throughput.py measures both.
CELERY_DB_REUSE_MAX = int(os.environ.get("BENCH_DB_REUSE_MAX") or 0)
# More CELERY_* settings as JSON (``{"BROKER_POOL_LIMIT": 1}``): bench/in_flight.py's worker.
for _name, _value in json.loads(os.environ.get("BENCH_CELERY") or "{}").items():
    globals()[f"CELERY_{_name}"] = _value
