from typing import Any

from celery import shared_task
from django.db import OperationalError

from .services import ConsolidationBusy, session_consolidation_run, session_sweep


@shared_task(
    bind=True,
    name="sessions.consolidate",
    acks_late=True,
    autoretry_for=(OperationalError,),  # a locked or dropped database: transient
    retry_backoff=True,
    retry_jitter=True,
    max_retries=5,
)
def consolidate_session(self: Any, consolidation_id: int) -> dict[str, object]:
    """Consolidate one session state (by its Consolidation id). Safe to run twice: a done one
    does nothing; one claimed by a live run is retried when that run's lease ends."""
    try:
        consolidation = session_consolidation_run(consolidation_id=consolidation_id)
    except ConsolidationBusy as busy:
        raise self.retry(countdown=max(1.0, busy.retry_in), max_retries=3) from busy
    return {"status": consolidation.status, "items": len(consolidation.memory_item_ids)}


@shared_task(name="sessions.sweep", acks_late=True)
def sweep_sessions() -> dict[str, object]:
    """The beat job: consolidate idle sessions before their TTL ends, expire the rest."""
    report = session_sweep()
    return {
        "consolidations": report.consolidations,
        "expired": report.expired,
        "resent": report.resent,
        "store_down": report.store_down,
    }
