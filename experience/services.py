"""Every write to the replay buffer. Each write transaction takes one "experience" revision,
so every process's replay index sees the change on its next request."""

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, QuerySet
from django.utils import timezone

from ferrum_memory.core.exceptions import Conflict
from ferrum_memory.core.revisions import revision_mark_purged, revision_take

from .models import Experience, ExperienceTombstone

REVISION = "experience"
# New items with no TD error get the buffer's max priority; an empty buffer starts here.
INITIAL_MAX_PRIORITY = 1.0
PURGE_CHUNK = 5_000


def priority_from_td_error(td_error: float) -> float:
    """p_i = (|delta_i| + eps) ** alpha under the configured alpha."""
    return (abs(td_error) + settings.REPLAY_EPSILON) ** settings.REPLAY_ALPHA


def _agent_max_priorities(agent_ids: Iterable[str]) -> dict[str, float]:
    rows = (
        Experience.objects.filter(agent_id__in=set(agent_ids))
        .values("agent_id")
        .annotate(top=Max("priority"))
        .values_list("agent_id", "top")
    )
    return dict(rows)


@dataclass(frozen=True)
class StoredExperience:
    experience: Experience
    created: bool


@transaction.atomic
def experience_create_many(
    *, items: Sequence[dict[str, Any]], now: datetime | None = None
) -> list[StoredExperience]:
    """Store validated experience dicts; an item whose experience_id exists is returned as stored.

    All or nothing: an id already used by another agent fails the whole call with 409.
    """
    now = now or timezone.now()
    revision = revision_take(name=REVISION)
    ids = [item["experience_id"] for item in items if item.get("experience_id")]
    existing = Experience.objects.in_bulk(ids, field_name="experience_id") if ids else {}
    for item in items:
        stored = existing.get(item.get("experience_id", ""))
        if stored is not None and stored.agent_id != item["agent_id"]:
            raise Conflict(
                f"Experience id '{stored.experience_id}' is already used by another agent.",
                experience_id=stored.experience_id,
            )
    new_items = [item for item in items if item.get("experience_id") not in existing]
    max_priority = _agent_max_priorities(item["agent_id"] for item in new_items)
    rows = [_new_row(item, revision, now, max_priority) for item in new_items]
    created = {row.experience_id: row for row in Experience.objects.bulk_create(rows)}
    return [
        StoredExperience(existing[item["experience_id"]], False)
        if item.get("experience_id") in existing
        else StoredExperience(created[item["experience_id"]], True)
        for item in items
    ]


def _new_row(
    item: dict[str, Any], revision: int, now: datetime, max_priority: dict[str, float]
) -> Experience:
    td_error = item.get("td_error")
    if td_error is None:
        priority = max_priority.get(item["agent_id"]) or INITIAL_MAX_PRIORITY
    else:
        priority = priority_from_td_error(td_error)
    ttl = item.get("ttl_seconds", settings.DEFAULT_REPLAY_TTL)
    test_result = item.get("test_result")
    return Experience(
        experience_id=item["experience_id"],
        agent_id=item["agent_id"],
        session_id=item.get("session_id") or "",
        task=item["task"],
        tool_calls=item.get("tool_calls", []),
        test_result=test_result,
        passed=None if test_result is None else test_result["passed"],
        reward=item["reward"],
        td_error=td_error,
        priority=priority,
        metadata=item.get("metadata", {}),
        created_at=now,
        expires_at=now + timedelta(seconds=ttl) if ttl else None,
        revision=revision,
    )


@dataclass(frozen=True)
class TdErrorUpdateResult:
    updated: int
    unknown_ids: list[str]


@transaction.atomic
def experience_td_error_update(
    *, updates: Sequence[tuple[str, float]], agent_ids: Sequence[str] | None = None
) -> TdErrorUpdateResult:
    """Set TD errors and the priorities they imply. Ids that do not exist, or that belong to an
    agent outside `agent_ids`, are reported back as unknown and nothing is written for them."""
    latest = dict(updates)  # a later update of the same id wins
    revision = revision_take(name=REVISION)
    visible = Experience.objects.filter(experience_id__in=latest)
    if agent_ids is not None:
        visible = visible.filter(agent_id__in=agent_ids)
    pks = dict(visible.values_list("experience_id", "id"))
    rows = [
        Experience(id=pk, td_error=latest[eid], priority=priority_from_td_error(latest[eid]))
        for eid, pk in pks.items()
    ]
    for row in rows:
        row.revision = revision
    Experience.objects.bulk_update(rows, ["td_error", "priority", "revision"], batch_size=1000)
    unknown = [eid for eid in latest if eid not in pks]
    return TdErrorUpdateResult(updated=len(rows), unknown_ids=unknown)


@transaction.atomic
def experience_curate(
    *, experience: Experience, td_error: float | None, priority: float | None
) -> Experience:
    """A curator's edit: a priority given is kept as is (an override); a TD error given without
    a priority sets the priority it implies."""
    if priority is not None and not (math.isfinite(priority) and priority >= 0):
        raise ValueError("priority must be a finite number >= 0")
    experience.td_error = td_error
    if priority is not None:
        experience.priority = priority
    elif td_error is not None:
        experience.priority = priority_from_td_error(td_error)
    experience.revision = revision_take(name=REVISION)
    experience.save(update_fields=["td_error", "priority", "revision"])
    return experience


@transaction.atomic
def experience_reset_priority_to_max(*, queryset: QuerySet[Experience]) -> int:
    """Give each selected experience its agent's current max priority."""
    revision = revision_take(name=REVISION)
    selected = list(queryset.values_list("id", "agent_id"))
    tops = _agent_max_priorities(agent for _, agent in selected)
    rows = [
        Experience(id=pk, priority=tops.get(agent) or INITIAL_MAX_PRIORITY, revision=revision)
        for pk, agent in selected
    ]
    Experience.objects.bulk_update(rows, ["priority", "revision"], batch_size=1000)
    return len(rows)


@transaction.atomic
def experience_recompute_priority(*, queryset: QuerySet[Experience]) -> int:
    """Priority from the TD error again (undoing overrides); items with no TD error are left."""
    revision = revision_take(name=REVISION)
    rows = [
        Experience(id=pk, priority=priority_from_td_error(td), revision=revision)
        for pk, td in queryset.exclude(td_error=None).values_list("id", "td_error")
        if td is not None
    ]
    Experience.objects.bulk_update(rows, ["priority", "revision"], batch_size=1000)
    return len(rows)


@transaction.atomic
def experience_delete_many(*, queryset: QuerySet[Experience]) -> int:
    """Delete experiences, leaving tombstones so every replay index drops them."""
    revision = revision_take(name=REVISION)
    doomed = list(queryset.values_list("id", "agent_id"))
    ExperienceTombstone.objects.bulk_create(
        [
            ExperienceTombstone(experience_pk=pk, agent_id=agent, revision=revision)
            for pk, agent in doomed
        ],
        ignore_conflicts=True,
    )
    Experience.objects.filter(id__in=[pk for pk, _ in doomed]).delete()
    return len(doomed)


def experience_mark_sampled(*, pks: Sequence[int], at: datetime | None = None) -> None:
    """Count each draw (with replacement, an item drawn twice counts twice). Sampling does not
    read these fields, so no revision is taken."""
    at = at or timezone.now()
    by_count: dict[int, list[int]] = {}
    for pk, count in Counter(pks).items():
        by_count.setdefault(count, []).append(pk)
    with transaction.atomic():
        for count, group in by_count.items():
            Experience.objects.filter(id__in=group).update(
                times_sampled=F("times_sampled") + count, last_sampled_at=at
            )


def experience_purge_expired(*, now: datetime | None = None) -> int:
    """Delete expired experiences in chunks, then tombstones older than the retention."""
    now = now or timezone.now()
    deleted = 0
    while True:
        chunk = Experience.objects.filter(expires_at__lte=now).order_by("id")[:PURGE_CHUNK]
        pks = list(chunk.values_list("id", flat=True))
        if not pks:
            break
        deleted += experience_delete_many(queryset=Experience.objects.filter(id__in=pks))
    horizon = now - timedelta(seconds=settings.REPLAY_TOMBSTONE_RETENTION)
    with transaction.atomic():
        old = ExperienceTombstone.objects.filter(deleted_at__lt=horizon)
        through = old.aggregate(top=Max("revision"))["top"]
        if through is not None:
            old.delete()
            revision_mark_purged(name=REVISION, through=through)
    return deleted
