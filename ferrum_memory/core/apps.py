from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from .models import ApiKey


class CoreConfig(AppConfig):
    name = "ferrum_memory.core"
    label = "core"
    verbose_name = "API access"

    def ready(self) -> None:
        # Registers the database and broker health checks and the OpenAPI auth extension.
        from django.db.models.signals import post_delete, post_migrate, post_save

        from . import checks, schema  # noqa: F401
        from .models import ApiKey
        from .schedules import ensure_default_schedules

        post_migrate.connect(ensure_default_schedules, sender=self)
        # Signals, not the services: a key also changes in the admin's change form and bulk
        # delete, and each such change must leave this process's authentication cache.
        post_save.connect(_forget_api_key, sender=ApiKey)
        post_delete.connect(_forget_api_key, sender=ApiKey)


def _forget_api_key(sender: type, instance: "ApiKey", **kwargs: object) -> None:
    from .selectors import api_key_forget

    api_key_forget(key_hash=instance.key_hash)
