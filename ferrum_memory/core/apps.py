from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "ferrum_memory.core"
    label = "core"
    verbose_name = "API access"

    def ready(self) -> None:
        # Registers the database and broker health checks and the OpenAPI auth extension.
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from . import checks, schema  # noqa: F401
        from .schedules import ensure_default_schedules
        from .storage import hold_wal_files

        post_migrate.connect(ensure_default_schedules, sender=self)
        connection_created.connect(hold_wal_files)
