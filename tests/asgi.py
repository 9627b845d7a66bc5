"""The ASGI application tests serve with uvicorn: the test settings, static files included,
and the agents served over MCP at /mcp (tests/test_mcp_serve.py)."""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from agentloop.web.mcp_asgi import mount_mcp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

if os.environ.get("AGENTLOOP_TEST_QUEUE"):
    # A test's Celery queue and broker (tests/celery_app.py): the site's jobs go to its workers.
    import tests.celery_app  # noqa: F401

application = mount_mcp(ASGIStaticFilesHandler(get_asgi_application()), path="/mcp")
