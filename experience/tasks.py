from celery import shared_task

from .dream_services import dream_cycles_run_due
from .services import experience_purge_expired


@shared_task(name="experience.purge_expired", acks_late=True)
def purge_expired_experiences() -> int:
    """Delete experiences past their expires_at (DEFAULT_REPLAY_TTL); safe to run twice."""
    return experience_purge_expired()


@shared_task(name="experience.dream_cycles", acks_late=True)
def run_dream_cycles() -> dict[str, object]:
    """The beat job: a dream cycle for each agent that is due (see dream_cycles_run_due).

    Two runs never overlap: the second finds the run lock taken and does nothing."""
    run = dream_cycles_run_due()
    return {
        "locked": run.locked,
        "cycles": {cycle.agent_id: cycle.pk for cycle in run.cycles},
        "skipped": run.skipped,
    }
