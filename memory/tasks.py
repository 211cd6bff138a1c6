from celery import shared_task

from .services import memory_count_word_pieces, memory_index_now, memory_purge_expired


@shared_task(name="memory.purge_expired", acks_late=True)
def purge_expired_memories() -> int:
    """Delete memory items past their expires_at; safe to run twice."""
    return memory_purge_expired()


@shared_task(name="memory.index_catch_up", acks_late=True)
def index_catch_up() -> bool:
    """Bring this worker's vector index up to the DB (items stored while it was down)."""
    return memory_index_now()


@shared_task(name="memory.count_word_pieces", acks_late=True)
def count_word_pieces() -> bool:
    """Count again how many items hold each word piece, if the items changed (the IDF by which
    hybrid search weighs a query's tokens)."""
    return memory_count_word_pieces()
