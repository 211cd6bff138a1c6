from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "ferrum_memory.core"
    label = "core"
    verbose_name = "API access"

    def ready(self) -> None:
        # Registers the database and broker health checks and the OpenAPI auth extension.
        from . import checks, schema  # noqa: F401
