"""The ASGI application tests serve with uvicorn: the test settings, static files included."""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

application = ASGIStaticFilesHandler(get_asgi_application())
