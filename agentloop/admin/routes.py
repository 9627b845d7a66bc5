"""The pages agentloop adds to a model admin, routed like the model admin's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.urls import URLPattern, path


def admin_path(model_admin: Any, route: str, view: Callable[..., Any], name: str) -> URLPattern:
    """``route`` served by ``view`` behind the admin site's checks (login, staff), named
    ``<app_label>_<model_name>_<name>`` like the model admin's own URLs."""
    opts = model_admin.opts
    return path(
        route,
        model_admin.admin_site.admin_view(view),
        name=f"{opts.app_label}_{opts.model_name}_{name}",
    )
