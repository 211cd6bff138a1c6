"""The database and broker health checks, and the service's own statistics."""

from typing import Any

from django.conf import settings
from django.db import connection

from ferrum_memory.celery import app as celery_app

from .health import register_check, register_stats

BROKER_TIMEOUT_SECONDS = 2.0


@register_check("database")
def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"engine": connection.vendor}


@register_check("broker")
def check_broker() -> dict[str, Any]:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
        return {"transport": conn.transport_cls}


@register_stats("service")
def service_stats(agent_ids: list[str] | None) -> dict[str, Any]:
    return {
        "version": settings.SPECTACULAR_SETTINGS["VERSION"],
        "database": connection.vendor,
        "mode": "scaled" if settings.REDIS_URL or connection.vendor != "sqlite" else "embedded",
    }
