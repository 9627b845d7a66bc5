"""The agentloop Django app."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class AgentloopConfig(AppConfig):
    name = "agentloop"
    verbose_name = _("Agent loop")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Function-local: these need the models, which load only now.
        from . import _deprecated, checks, receivers  # noqa: F401  (registers checks, receivers)

        _deprecated.add_model_aliases()
