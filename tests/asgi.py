"""The ASGI application tests serve with uvicorn: the test settings, static files included,
and, when ``AGENTLOOP_TEST_MCP_MOUNT`` is set, the agents served over MCP at /mcp
(tests/test_mcp_serve.py)."""

import os
from typing import Any

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from agentloop.web.mcp_asgi import mount_mcp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

if os.environ.get("AGENTLOOP_TEST_QUEUE"):
    # A test's Celery queue and broker (tests/celery_app.py): the site's jobs go to its workers.
    import tests.celery_app  # noqa: F401

application: Any = ASGIStaticFilesHandler(get_asgi_application())
if os.environ.get("AGENTLOOP_TEST_MCP_MOUNT"):
    # Only tests/test_mcp_serve.py's sites: the mount starts the SDK's session manager at
    # the lifespan's startup, importing the mcp SDK (about 0.5 s of CPU a server start).
    application = mount_mcp(application, path="/mcp")
