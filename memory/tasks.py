from celery import shared_task

from .services import memory_index_now, memory_purge_expired


@shared_task(name="memory.purge_expired", acks_late=True)
def purge_expired_memories() -> int:
    """Delete memory items past their expires_at; safe to run twice."""
    return memory_purge_expired()


@shared_task(name="memory.index_catch_up", acks_late=True)
def index_catch_up() -> bool:
    """Bring this worker's vector index up to the DB (items stored while it was down)."""
    return memory_index_now()
