"""Settings for the example site; defaults run the demo with SQLite and no other service."""

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent

# The dev default keeps `make demo` zero-config; anything public must set DJANGO_SECRET_KEY.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-agentloop-example-only")
DEBUG = os.environ.get("DJANGO_DEBUG", "true").lower() in {"1", "true", "yes", "on"}
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "agentloop",
    "example_project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES: dict[str, dict[str, Any]]
if os.environ.get("DATABASE_URL"):
    # Imported only here: dj-database-url is a dev extra, and the demo must run without it.
    import dj_database_url

    DATABASES = {"default": dj_database_url.config()}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            # Background steps write from other threads: take the write lock up front and wait
            # for it instead of failing with "database is locked".
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# "demo:rule-based" answers offline, so the example needs no API key; DEMO is what
# `manage.py agentloop demo` (and `make demo`) runs. AGENTLOOP_MODEL picks a real model
# instead, e.g. AGENTLOOP_MODEL=openai:gpt-4.1-mini with OPENAI_API_KEY set.
AGENTLOOP = {
    "DEFAULT_MODEL": os.environ.get("AGENTLOOP_MODEL") or "demo:rule-based",
    "DEMO": "example_project.demo.DEMO",
    # The chat page shows a streaming answer from its partial row (no Redis needed):
    # saved often, read often, so the text grows smoothly.
    "PARTIAL_SAVE_INTERVAL": 0.2,
    "EVENTS_POLL_INTERVAL": 0.2,
    # With Redis, pages get every streamed chunk as it comes (and cancels travel faster).
    "REDIS_URL": os.environ.get("AGENTLOOP_REDIS_URL") or None,
}
