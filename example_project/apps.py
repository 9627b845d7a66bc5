"""The example site's app: registers the offline demo model when Django starts."""

from django.apps import AppConfig


class ExampleProjectConfig(AppConfig):
    name = "example_project"
    verbose_name = "Example project"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentloop import providers

        from .demo.provider import RuleBasedProvider

        # "demo:rule-based" (the site's DEFAULT_MODEL) answers offline, with no API key.
        providers.register("demo", RuleBasedProvider())
