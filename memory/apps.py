from typing import Any

from django.apps import AppConfig

PURGE_EVERY_SECONDS = 600
# Indexes what a store could not (index down) and keeps a shared server index current.
CATCH_UP_EVERY_SECONDS = 60


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Long-term memory"

    def ready(self) -> None:
        from ferrum_memory.core.health import register_check, register_stats
        from ferrum_memory.core.schedules import register_default_schedule

        from .selectors import memory_stats

        register_default_schedule(
            name="memory: purge expired",
            task="memory.purge_expired",
            every_seconds=PURGE_EVERY_SECONDS,
        )
        register_default_schedule(
            name="memory: index catch-up",
            task="memory.index_catch_up",
            every_seconds=CATCH_UP_EVERY_SECONDS,
        )
        register_stats("memory")(memory_stats)
        register_check("vector_index")(check_vector_index)


def check_vector_index() -> dict[str, Any]:
    """Up when this process's index can catch up with the DB; reports its lag in revisions."""
    from ferrum_memory.core.revisions import revision_state

    from .vector_index import get_vector_index

    index = get_vector_index()
    index.catch_up()
    return {
        "engine": index.engine_name,
        "cursor": index.cursor,
        "lag": revision_state(name="memory")[0] - index.cursor,
    }
