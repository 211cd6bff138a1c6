from datetime import datetime

from celery import shared_task

from .dream_services import dream_cycles_run_due
from .replay_services import replay_snapshot_take
from .services import experience_mark_sampled, experience_purge_expired


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


@shared_task(name="experience.mark_sampled", acks_late=True)
def mark_sampled(pks: list[int], at: str) -> None:
    """Count replay draws (pks, with repeats) at `at` (ISO 8601): a web process's tally of
    about a second of requests (experience.services._DrawTally).

    At least once, not exactly once: a worker lost after the commit and before the ack runs it
    again, and those draws count twice. That is a rare over-count of a curation statistic;
    exactly once would need a receipt written per replay request and kept for the retry window,
    for a number that sampling never reads. A lost count would be worse, hence acks_late."""
    experience_mark_sampled(pks=pks, at=datetime.fromisoformat(at))


@shared_task(name="experience.replay_snapshot", acks_late=True)
def take_replay_snapshot() -> int:
    """Record each agent's replay counters for the dashboard's history (run twice: two
    points a moment apart)."""
    return replay_snapshot_take()
