"""The database, broker and storage health checks, and the service's own statistics."""

from typing import Any

from django.conf import settings
from django.db import connection

from ferrum_memory.celery import app as celery_app

from .health import register_check, register_stats
from .storage import require_room

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


@register_check("storage")
def check_storage() -> dict[str, Any]:
    """Down while the data folder (SQLite, shards, broker file, cache) is (nearly) full: writes
    then answer 507, reads work, and the index waits for space to catch up."""
    return {"free_bytes": require_room(settings.DATA_DIR)}


@register_stats("service")
def service_stats(agent_ids: list[str] | None) -> dict[str, Any]:
    return {
        "version": settings.SPECTACULAR_SETTINGS["VERSION"],
        "database": connection.vendor,
        "mode": "scaled" if settings.REDIS_URL or connection.vendor != "sqlite" else "embedded",
    }
