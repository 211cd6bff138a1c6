"""Replay controls: per-agent settings, the samples-per-insert rate limiter, and the draw that
applies them with the sampling cap. (Capacity is enforced by the insert itself, in
services.experience_create_many.)

The limiter is Reverb's SampleToInsertRatio: a draw of n is granted while the agent holds at
least min_size items and samples + n <= (inserts - min_size) * samples_per_insert + tolerance.
Its state is the agent's ReplayState row, so every web and worker process shares it; a grant is
one conditional UPDATE, whose row count says whether it was granted. Inserts are never refused:
an agent's experience is data, so only the upper bound of Reverb's window is enforced.

The cap needs exact counts, so a capped agent's draw is counted in the transaction it is made
in, holding the experience revision lock: two replays of one agent cannot both draw an item's
last allowed time. The asynchronous tally counts the other draws.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, ExpressionWrapper, F, FloatField, Value
from django.utils import timezone

from ferrum_memory.core.exceptions import Conflict, TooManyRequests
from ferrum_memory.core.revisions import revision_lock, revision_take

from .models import Experience, ReplaySettings, ReplaySnapshot, ReplayState
from .replay_index import get_replay_index
from .replay_selectors import (
    ReplayControls,
    replay_controls_anywhere,
    replay_controls_get,
    replay_defaults,
    replay_state_get,
)
from .selectors import ReplayBatch, replay_sample
from .services import REVISION, experience_mark_sampled, experience_mark_sampled_later

LIMITER_POLL_SECONDS = 0.02
MAX_COUNT = 2**63 - 1
RETRY_AFTER_SECONDS = 1


# Settings ------------------------------------------------------------------------------------


@transaction.atomic
def replay_settings_put(*, agent_id: str, values: dict[str, Any]) -> ReplayControls:
    """Set an agent's replay settings: each one given, the default for each one left out."""
    ReplaySettings.objects.update_or_create(
        agent_id=agent_id, defaults={**replay_defaults(), **values}
    )
    return replay_controls_get(agent_id=agent_id)


# The rate limiter ----------------------------------------------------------------------------


def _ceiling(controls: ReplayControls, count: int) -> ExpressionWrapper:
    """(inserts - min_size) * samples_per_insert + tolerance - count, in SQL."""
    return ExpressionWrapper(
        (F("inserts") - Value(controls.min_size)) * Value(controls.samples_per_insert)
        + Value(controls.spi_tolerance - count),
        output_field=FloatField(),
    )


def _grant(controls: ReplayControls, count: int) -> bool:
    return bool(
        ReplayState.objects.filter(
            agent_id=controls.agent_id,
            size__gte=controls.min_size,
            samples__lte=_ceiling(controls, count),
        ).update(samples=F("samples") + count)
    )


@dataclass(frozen=True)
class LimiterStatus:
    """Where an agent stands against its limiter, as a 429 and the settings endpoint show it."""

    inserts: int
    samples: int
    size: int
    ratio: float | None  # samples per insert so far; None before the first insert
    allowed: float  # draws the limiter would grant now
    inserts_needed: int  # before a draw of the asked size is granted (0: it would be)


def replay_limiter_status(*, controls: ReplayControls, count: int = 1) -> LimiterStatus:
    state = replay_state_get(agent_id=controls.agent_id)
    allowed = (
        (state.inserts - controls.min_size) * controls.samples_per_insert
        + controls.spi_tolerance
        - state.samples
    )
    needed = 0.0
    if controls.samples_per_insert > 0:
        short = (state.samples + count - controls.spi_tolerance) / controls.samples_per_insert
        needed = short + controls.min_size - state.inserts
    # A tiny ratio needs more inserts than a count can say: the largest count, then.
    needed = min(max(needed, controls.min_size - state.size, 0.0), MAX_COUNT)
    return LimiterStatus(
        inserts=state.inserts,
        samples=state.samples,
        size=state.size,
        ratio=state.samples / state.inserts if state.inserts else None,
        allowed=max(0.0, allowed) if state.size >= controls.min_size else 0.0,
        inserts_needed=min(math.ceil(needed - 1e-9), MAX_COUNT) if needed > 0 else 0,
    )


def replay_limiter_acquire(*, controls: ReplayControls, count: int, wait_ms: int = 0) -> None:
    """Grant `count` draws, waiting up to `wait_ms` for inserts; TooManyRequests (429) if not."""
    deadline = time.monotonic() + wait_ms / 1000
    while not _grant(controls, count):
        left = deadline - time.monotonic()
        if left <= 0:
            status = replay_limiter_status(controls=controls, count=count)
            raise TooManyRequests(
                f"The rate limiter of agent '{controls.agent_id}' grants no {count} draws now: "
                f"{status.samples} samples for {status.inserts} inserts, "
                f"{controls.samples_per_insert:g} samples per insert allowed "
                f"(tolerance {controls.spi_tolerance:g}, min_size {controls.min_size}); "
                f"{status.inserts_needed} more inserts are needed.",
                retry_after=RETRY_AFTER_SECONDS,
                ratio=status.ratio,
                samples=status.samples,
                inserts=status.inserts,
                inserts_needed=status.inserts_needed,
                samples_per_insert=controls.samples_per_insert,
                spi_tolerance=controls.spi_tolerance,
                min_size=controls.min_size,
            )
        time.sleep(min(LIMITER_POLL_SECONDS, left))


def replay_limiter_refund(*, agent_id: str, count: int) -> None:
    """Give back draws granted but not made (the sample failed or came out short)."""
    if count > 0:
        ReplayState.objects.filter(agent_id=agent_id).update(samples=F("samples") - count)


# The draw ------------------------------------------------------------------------------------


def replay_draw(
    *,
    agent_id: str | None,
    batch_size: int,
    alpha: float | None = None,
    wait_ms: int = 0,
    count_now: bool = False,
    now: datetime | None = None,
    **params: Any,
) -> ReplayBatch:
    """A replay batch under the agent's controls: the rate limiter grants the draws first, the
    sampling cap retires what it uses up. The draws are counted (times_sampled) by the tally,
    or here with `count_now` (a dream cycle), or exactly in the draw's transaction when the
    agent has a cap. `alpha` None: the agent's own.

    A replay over every agent is refused while any agent has a limiter or a cap: both are one
    agent's, and a draw across agents could not be granted or counted against them."""
    if agent_id is None:
        if replay_controls_anywhere():
            # 409: a well-formed request refused because of the server's state (controls set).
            raise Conflict(
                "Name an agent_id: replay controls (a rate limiter or a sampling cap) are set, "
                "and they apply to one agent's replay.",
                agent_id=["Required while replay controls are set."],
            )
        batch = replay_sample(
            agent_id=None,
            batch_size=batch_size,
            alpha=settings.REPLAY_ALPHA if alpha is None else alpha,
            **params,
        )
        _count(batch, count_now, now)
        return batch
    controls = replay_controls_get(agent_id=agent_id)
    alpha = controls.alpha if alpha is None else alpha
    if controls.capped and transaction.get_connection().in_atomic_block:
        # The caller's transaction (a dream cycle) would hold the grant's row lock on the
        # agent's state into the capped draw's revision lock: take the revision lock first,
        # in the order inserts take them (the counter, then the state), so no two deadlock.
        revision_lock(name=REVISION)
    if controls.limited:
        replay_limiter_acquire(controls=controls, count=batch_size, wait_ms=wait_ms)
    try:
        if controls.capped:
            batch = _draw_capped(controls, batch_size, alpha, now, params)
        else:
            batch = replay_sample(agent_id=agent_id, batch_size=batch_size, alpha=alpha, **params)
            _count(batch, count_now, now)
    except BaseException:
        if controls.limited:
            replay_limiter_refund(agent_id=agent_id, count=batch_size)
        raise
    if controls.limited:
        replay_limiter_refund(agent_id=agent_id, count=batch_size - len(batch.items))
    return batch


def _count(batch: ReplayBatch, now_: bool, at: datetime | None) -> None:
    pks = [item.experience.pk for item in batch.items]
    if now_:
        experience_mark_sampled(pks=pks, at=at)
    else:
        experience_mark_sampled_later(pks=pks, at=at)


def _allowance(cap: int) -> Callable[[list[int]], dict[int, int]]:
    def remaining(pks: list[int]) -> dict[int, int]:
        counts = dict(Experience.objects.filter(id__in=pks).values_list("id", "times_sampled"))
        return {pk: cap - counts.get(pk, cap) for pk in pks}  # gone since: nothing left

    return remaining


def _draw_capped(
    controls: ReplayControls,
    batch_size: int,
    alpha: float,
    now: datetime | None,
    params: dict[str, Any],
) -> ReplayBatch:
    """Sample, count and retire in one transaction that holds the experience revision lock:
    every write that retired an item before has committed, and none can until this one does.
    A revision is taken only when the draw retires something (other processes' indexes then
    drop it); a draw that retires nothing leaves them nothing to catch up on."""
    now = now or timezone.now()
    index = get_replay_index()
    try:
        with transaction.atomic():
            revision_lock(name=REVISION)
            batch = replay_sample(
                agent_id=controls.agent_id,
                batch_size=batch_size,
                alpha=alpha,
                allowance=_allowance(controls.max_times_sampled),
                **params,
            )
            experience_mark_sampled(pks=[item.experience.pk for item in batch.items], at=now)
            if batch.retired:
                revision = revision_take(name=REVISION)
                retired = Experience.objects.filter(id__in=batch.retired, retired_at=None)
                count = retired.update(retired_at=now, revision=revision)
                ReplayState.objects.filter(agent_id=controls.agent_id).update(
                    retired=F("retired") + count
                )
    except Conflict:
        raise  # too few items: nothing was drawn, nothing retired in the trees but over-cap ones
    except BaseException:
        index.invalidate()  # the trees dropped items this rollback keeps sampleable
        raise
    return batch


@transaction.atomic
def replay_state_recount(*, agent_ids: list[str] | None = None) -> int:
    """Set agents' sizes (None: every agent's) from their rows, holding the revision lock so no
    insert or delete runs meanwhile; an agent with rows and no counters gets them (inserts =
    rows). For rows loaded around the service; the writes keep the counts otherwise."""
    revision_take(name=REVISION)
    rows = (
        Experience.objects.all()
        if agent_ids is None
        else Experience.objects.filter(agent_id__in=agent_ids)
    )
    sizes = dict(rows.values("agent_id").annotate(n=Count("id")).values_list("agent_id", "n"))
    wanted = set(sizes) | set(agent_ids or ())
    ReplayState.objects.bulk_create(
        [ReplayState(agent_id=a, inserts=sizes.get(a, 0)) for a in wanted], ignore_conflicts=True
    )
    for agent in wanted:
        ReplayState.objects.filter(agent_id=agent).update(size=sizes.get(agent, 0))
    return len(wanted)


# The dashboard's history ---------------------------------------------------------------------


def replay_snapshot_take(*, now: datetime | None = None) -> int:
    """Record every agent's counters (the beat runs it every REPLAY_SNAPSHOT_SECONDS)."""
    now = now or timezone.now()
    rows = [
        ReplaySnapshot(
            agent_id=state.agent_id,
            at=now,
            size=state.size,
            inserts=state.inserts,
            samples=state.samples,
            removals=state.removals,
            retired=state.retired,
        )
        for state in ReplayState.objects.all()
    ]
    ReplaySnapshot.objects.bulk_create(rows, batch_size=1000)
    return len(rows)
