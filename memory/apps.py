import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

from django.apps import AppConfig

PURGE_EVERY_SECONDS = 600
# Indexes what a store could not (index down) and keeps a shared server index current.
CATCH_UP_EVERY_SECONDS = 60
# The word pieces' document frequencies (memory.services.memory_count_word_pieces): counted
# again this often if the items changed (tokenising 10^5 LoCoMo turns took 12 s, at a load of 3).
COUNT_WORD_PIECES_EVERY_SECONDS = 600


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
        register_default_schedule(
            name="memory: count word pieces",
            task="memory.count_word_pieces",
            every_seconds=COUNT_WORD_PIECES_EVERY_SECONDS,
        )
        register_stats("memory")(memory_stats)
        register_check("vector_index")(check_vector_index)


_build_lock = threading.Lock()
_build: Future[None] | None = None  # the background (re)build under way, if any
_builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vector-index-build")


def _build_index(index: Any) -> None:
    from django.db import connections

    try:
        index.catch_up()
    finally:
        connections.close_all()  # this thread's: it may sit idle for long


def check_vector_index() -> dict[str, Any]:
    """Up when this process's index can catch up with the DB; reports its lag in revisions.
    An index with no cursor (never built here, or its shard folder found unusable) is built
    from the DB in the background, and reported as rebuilding meanwhile."""
    global _build
    from django.conf import settings

    from ferrum_memory.core.health import REBUILDING
    from ferrum_memory.core.revisions import revision_state

    from .vector_index import get_vector_index

    index = get_vector_index()
    if index.cursor < 0:
        with _build_lock:
            if _build is None:
                _build = _builder.submit(_build_index, index)
            build = _build
        try:
            # A longer build goes on in the background: rebuilding until it is done.
            build.result(timeout=settings.VECTOR_INDEX_HEALTH_WAIT_SECONDS)  # raises its error
        except FuturesTimeout:
            return {"status": REBUILDING, "engine": index.engine_name, "cursor": -1}
        finally:
            with _build_lock:
                if build.done() and _build is build:
                    _build = None  # reported: a failed build is tried again next time
    index.catch_up()
    return {
        "engine": index.engine_name,
        "cursor": index.cursor,
        "lag": revision_state(name="memory")[0] - index.cursor,
    }
