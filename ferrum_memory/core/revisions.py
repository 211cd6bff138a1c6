"""Revisions: how derived indexes (replay trees, vector index) follow the DB."""

from django.db import transaction
from django.db.models import F

from .models import RevisionCounter


def revision_take(*, name: str) -> int:
    """Take the next revision of counter `name` for the current transaction.

    Must run inside the write transaction: the counter row stays locked until it commits, which
    orders commits by revision. Take it once per transaction, just before writing.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("revision_take() must run inside the write transaction")
    if not RevisionCounter.objects.filter(name=name).update(value=F("value") + 1):
        RevisionCounter.objects.get_or_create(name=name)
        RevisionCounter.objects.filter(name=name).update(value=F("value") + 1)
    return RevisionCounter.objects.values_list("value", flat=True).get(name=name)


def revision_state(*, name: str) -> tuple[int, int]:
    """(current revision, purged_through) of counter `name`; (0, 0) before its first write."""
    row = RevisionCounter.objects.filter(name=name).values_list("value", "purged_through").first()
    return row or (0, 0)


def revision_mark_purged(*, name: str, through: int) -> None:
    RevisionCounter.objects.filter(name=name, purged_through__lt=through).update(
        purged_through=through
    )
