"""Every write of dream cycles: scheduled replay batches handed to a learner.

A cycle is drawn through the same path as GET /experience/replay (selectors.replay_sample, which
catches the replay index up with the DB), and the learner's TD errors go through
services.experience_td_error_update, so every process's replay index sees the new priorities.
"""

import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Max, Q, QuerySet
from django.utils import timezone

from ferrum_memory.core.exceptions import Conflict, TooManyRequests
from ferrum_memory.core.metrics import DREAM_CYCLES
from ferrum_memory.core.telemetry import traced

from .dream_selectors import dream_agents_due, dream_cycle_get
from .models import DreamCycle, DreamCycleItem, DreamLock
from .replay_services import replay_draw
from .services import experience_td_error_update

RUN_LOCK = "dream-cycles"


def dream_beta(*, number: int) -> float:
    """Beta of an agent's cycle `number` (from 1): DREAM_BETA0 on the first, rising linearly to
    1 at cycle 1 + DREAM_BETA_ANNEAL_CYCLES and staying there (Schaul et al. anneal to 1 so the
    updates are unbiased by the end of learning)."""
    beta0, cycles = settings.DREAM_BETA0, settings.DREAM_BETA_ANNEAL_CYCLES
    if cycles <= 0:
        return 1.0
    return min(1.0, beta0 + (1.0 - beta0) * (number - 1) / cycles)


# The run lock ----------------------------------------------------------------------------------


def dream_lock_acquire(*, name: str, seconds: float, now: datetime | None = None) -> str | None:
    """Take the named lease for `seconds`; return its token, or None while another holds it.

    A conditional UPDATE whose row count says who won: atomic on SQLite and PostgreSQL alike."""
    now = now or timezone.now()
    DreamLock.objects.bulk_create([DreamLock(name=name)], ignore_conflicts=True)
    token = secrets.token_hex(16)
    free = Q(until__isnull=True) | Q(until__lte=now)
    won = DreamLock.objects.filter(free, name=name).update(
        holder=token, until=now + timedelta(seconds=seconds)
    )
    return token if won else None


def dream_lock_release(*, name: str, token: str) -> None:
    # Only its holder frees a lease: one that expired and was taken over stays with the new one.
    DreamLock.objects.filter(name=name, holder=token).update(holder="", until=None)


@contextmanager
def dream_run_lock() -> Iterator[bool]:
    """Hold the dream-run lock for the block; yields False (and holds nothing) when it is taken.

    It lasts as long as the task's hard time limit, so it cannot expire under a live run, and a
    run killed without releasing it blocks the next ones for that long at most."""
    token = dream_lock_acquire(name=RUN_LOCK, seconds=settings.CELERY_TASK_TIME_LIMIT)
    try:
        yield token is not None
    finally:
        if token is not None:
            dream_lock_release(name=RUN_LOCK, token=token)


# Recording cycles ------------------------------------------------------------------------------


@traced("dream.cycle", lambda **call: {"agent_id": call["agent_id"]}, done=DREAM_CYCLES)
def dream_cycle_run(
    *, agent_id: str, seed: int | None = None, now: datetime | None = None
) -> DreamCycle:
    """Draw one batch for `agent_id` with the configured strategy and the agent's alpha, under
    its replay controls; record it; mark it sampled.

    Raises Conflict (409) when the agent holds fewer than DREAM_MIN_EXPERIENCES sampleable
    experiences, TooManyRequests (429) when its rate limiter grants no batch now. Callers hold
    the run lock, so the cycle number cannot be taken twice."""
    now = now or timezone.now()
    seed = secrets.randbits(63) if seed is None else seed
    last = DreamCycle.objects.filter(agent_id=agent_id).aggregate(top=Max("number"))["top"]
    number = (last or 0) + 1
    # One transaction: a cycle that fails to be recorded leaves no draws granted or counted.
    with transaction.atomic():
        batch = replay_draw(
            strategy=settings.DREAM_STRATEGY,
            batch_size=settings.DREAM_BATCH_SIZE,
            beta=dream_beta(number=number),
            half_life=settings.DREAM_HALF_LIFE,
            agent_id=agent_id,
            seed=seed,
            min_size=max(1, settings.DREAM_MIN_EXPERIENCES),
            count_now=True,
            now=now,
        )
        cycle = DreamCycle.objects.create(
            agent_id=agent_id,
            number=number,
            strategy=batch.strategy,
            alpha=batch.alpha,
            beta=batch.beta,
            seed=seed,
            buffer_size=batch.buffer_size,
            created_at=now,
        )
        DreamCycleItem.objects.bulk_create(
            DreamCycleItem(
                cycle=cycle,
                position=position,
                experience_pk=item.experience.pk,
                experience_id=item.experience.experience_id,
                probability=item.probability,
                weight=item.weight,
                td_error_before=item.experience.td_error,
            )
            for position, item in enumerate(batch.items)
        )
    return cycle


@dataclass
class DreamRun:
    locked: bool  # False: another run held the lock, so this one did nothing
    cycles: list[DreamCycle] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # agent_id: why


def dream_cycles_run_due(*, now: datetime | None = None) -> DreamRun:
    """The beat job: one cycle for each agent with at least DREAM_MIN_EXPERIENCES experiences
    and fewer than DREAM_MAX_PENDING cycles not completed. Never overlaps another run."""
    with dream_run_lock() as locked:
        if not locked:
            return DreamRun(locked=False)
        run = DreamRun(locked=True)
        agents = dream_agents_due(min_experiences=settings.DREAM_MIN_EXPERIENCES, now=now)
        backlog = dict(
            DreamCycle.objects.filter(agent_id__in=agents)
            .exclude(status=DreamCycle.Status.COMPLETED)
            .values("agent_id")
            .annotate(n=Count("id"))
            .values_list("agent_id", "n")
        )
        for agent_id in agents:
            limit = settings.DREAM_MAX_PENDING
            if limit and backlog.get(agent_id, 0) >= limit:
                run.skipped[agent_id] = f"{limit} cycles wait for a learner"
                continue
            try:
                run.cycles.append(dream_cycle_run(agent_id=agent_id, now=now))
            except Conflict as exc:  # items expired since the count: skip this agent this time
                run.skipped[agent_id] = exc.message
            except TooManyRequests as exc:  # its rate limiter: not before more inserts
                run.skipped[agent_id] = exc.message
        return run


# The learner hand-off --------------------------------------------------------------------------


def _oldest_claimable(*, agent_id: str, claimable: Q) -> int | None:
    return (
        DreamCycle.objects.filter(claimable, agent_id=agent_id)
        .order_by("id")
        .values_list("pk", flat=True)
        .first()
    )


def dream_cycle_claim(
    *,
    agent_id: str,
    learner: str,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> DreamCycle | None:
    """Lease the agent's oldest cycle that is pending or whose lease ran out; None if none is.

    Exactly one claimer wins a cycle: the UPDATE re-checks that it is still claimable, and a
    claimer whose UPDATE changed no row lost the race and tries the next candidate."""
    now = now or timezone.now()
    lease = timedelta(
        seconds=settings.DREAM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    )
    claimable = Q(status=DreamCycle.Status.PENDING) | Q(
        status=DreamCycle.Status.CLAIMED, lease_until__lte=now
    )
    while (candidate := _oldest_claimable(agent_id=agent_id, claimable=claimable)) is not None:
        token = secrets.token_hex(16)
        won = DreamCycle.objects.filter(claimable, pk=candidate).update(
            status=DreamCycle.Status.CLAIMED,
            claimed_by=learner,
            claimed_at=now,
            lease_until=now + lease,
            lease_token=token,
            claim_count=F("claim_count") + 1,
        )
        if won:
            return dream_cycle_get(cycle_id=candidate)
    return None


@dataclass(frozen=True)
class DreamCompletion:
    cycle: DreamCycle
    updated: int
    unknown_ids: list[str]  # experiences deleted since the draw: nothing to update


@transaction.atomic
def dream_cycle_complete(
    *,
    cycle_id: int,
    lease_token: str,
    td_errors: Sequence[tuple[str, float]],
    agent_ids: Sequence[str] | None = None,
    now: datetime | None = None,
) -> DreamCompletion:
    """Record the learner's new TD errors for every experience of the cycle and complete it.

    Only the holder of the current lease may (409 otherwise: the lease was taken over, or the
    cycle is completed); the TD errors must cover exactly the cycle's experiences (409 too: the
    body is well formed, it does not fit this cycle's draws)."""
    now = now or timezone.now()
    cycle = dream_cycle_get(cycle_id=cycle_id, agent_ids=agent_ids)
    items = list(cycle.items.all())
    reported = dict(td_errors)  # a later value for the same id wins
    expected = {item.experience_id for item in items}
    missing, foreign = sorted(expected - reported.keys()), sorted(reported.keys() - expected)
    if missing or foreign:
        raise Conflict(
            "Report one TD error for each experience of the cycle, and no other.",
            missing_ids=missing,
            foreign_ids=foreign,
        )
    completed = DreamCycle.objects.filter(
        pk=cycle.pk, status=DreamCycle.Status.CLAIMED, lease_token=lease_token
    ).update(status=DreamCycle.Status.COMPLETED, completed_at=now, lease_until=None)
    if not completed:
        raise Conflict(
            "This cycle is not leased with that token: its lease was taken over by another "
            "learner, or it is already completed.",
            status=DreamCycle.objects.values_list("status", flat=True).get(pk=cycle.pk),
        )
    result = experience_td_error_update(updates=list(reported.items()), agent_ids=[cycle.agent_id])
    for item in items:
        item.td_error_after = reported[item.experience_id]
    DreamCycleItem.objects.bulk_update(items, ["td_error_after"], batch_size=1000)
    cycle.refresh_from_db()
    return DreamCompletion(cycle=cycle, updated=result.updated, unknown_ids=result.unknown_ids)


# Curation in the admin -------------------------------------------------------------------------


def dream_cycle_release(*, queryset: QuerySet[DreamCycle]) -> int:
    """Give claimed cycles back to the pool: the next claim takes them, the old token is void."""
    return queryset.filter(status=DreamCycle.Status.CLAIMED).update(
        status=DreamCycle.Status.PENDING, lease_until=None, lease_token=""
    )


@transaction.atomic
def dream_cycle_delete_many(*, queryset: QuerySet[DreamCycle]) -> int:
    """Delete cycles and their items (no replay index depends on them)."""
    pks = list(queryset.values_list("pk", flat=True))
    DreamCycle.objects.filter(pk__in=pks).delete()
    return len(pks)
