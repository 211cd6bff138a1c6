from celery import shared_task

from .services import experience_purge_expired


@shared_task(name="experience.purge_expired", acks_late=True)
def purge_expired_experiences() -> int:
    """Delete experiences past their expires_at (DEFAULT_REPLAY_TTL); safe to run twice."""
    return experience_purge_expired()
