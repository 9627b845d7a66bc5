"""ASGI entry point of the example site (uvicorn), for streams that don't hold a thread.

``uvicorn example_project.asgi:application``; with ``DEBUG`` on, static files are served
too (runserver does that for WSGI).
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_asgi_application()

if settings.DEBUG:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)
