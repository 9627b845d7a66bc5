"""The tests' settings with ``CELERY_DB_REUSE_MAX`` set, as docs/install.md once gave it to
every worker: a worker started on these with Django's pool and ``-P threads`` starves the pool
(issue 41, defect 15; tests/test_pool_checks.py)."""

from tests.settings import *  # noqa: F403 - the tests' settings, one more on top

CELERY_DB_REUSE_MAX = 1000
