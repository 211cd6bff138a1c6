"""Every non-trivial read of dream cycles, and the replay dashboard's figures."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Avg, Count, Max, Min, Q, QuerySet
from django.db.models.functions import Abs, Trunc

from ferrum_memory.core.exceptions import NotFound

from .models import DreamCycle, Experience
from .replay_selectors import replay_controls_table, replay_history
from .selectors import experience_in_bulk, experience_visible

HISTOGRAM_BINS = 20
MAX_TIME_BUCKETS = 48
TOP_AGENTS = 20
RECENT_CYCLES = 20


def dream_agents_due(*, min_experiences: int, now: datetime | None = None) -> list[str]:
    """Agents holding at least `min_experiences` unexpired, unretired experiences, in name
    order."""
    return list(
        experience_visible(now=now)
        .filter(retired_at=None)
        .values("agent_id")
        .annotate(n=Count("id"))
        .filter(n__gte=max(1, min_experiences))
        .order_by("agent_id")
        .values_list("agent_id", flat=True)
    )


def dream_cycle_list(
    *,
    agent_ids: Sequence[str] | None = None,
    agent_id: str | None = None,
    status: str | None = None,
) -> QuerySet[DreamCycle]:
    queryset = DreamCycle.objects.annotate(item_count=Count("items"))
    if agent_ids is not None:
        queryset = queryset.filter(agent_id__in=agent_ids)
    if agent_id:
        queryset = queryset.filter(agent_id=agent_id)
    if status:
        queryset = queryset.filter(status=status)
    return queryset.order_by("-id")


def dream_cycle_get(*, cycle_id: int, agent_ids: Sequence[str] | None = None) -> DreamCycle:
    """A cycle the caller may see; NotFound (404) hides another agent's cycle too."""
    cycle = dream_cycle_list(agent_ids=agent_ids).filter(pk=cycle_id).first()
    if cycle is None:
        raise NotFound(f"No dream cycle {cycle_id}.")
    return cycle


def dream_cycle_experiences(*, cycle: DreamCycle) -> dict[int, Experience]:
    """The cycle's experiences that still exist, by pk (the TTL purge may have deleted some)."""
    return experience_in_bulk(cycle.items.values_list("experience_pk", flat=True))


# The replay dashboard ------------------------------------------------------------------------


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int


def histogram(queryset: QuerySet[Any], field: str, bins: int = HISTOGRAM_BINS) -> list[Bin]:
    """Equal-width bins over [min, max] of `field`, counted in the DB in one scan (the last
    bin includes max); rows where the field is null are left out."""
    span = queryset.aggregate(low=Min(field), high=Max(field))
    low, high = span["low"], span["high"]
    if low is None or high is None:
        return []
    if high == low:
        return [Bin(low, high, queryset.filter(**{field: low}).count())]
    width = (high - low) / bins
    edges = [low + i * width for i in range(bins)] + [high]
    counts = queryset.aggregate(
        **{
            f"bin{i}": Count(
                "pk",
                filter=Q(**{f"{field}__gte": edges[i]})
                & Q(**{f"{field}__lte" if i == bins - 1 else f"{field}__lt": edges[i + 1]}),
            )
            for i in range(bins)
        }
    )
    return [Bin(edges[i], edges[i + 1], counts[f"bin{i}"]) for i in range(bins)]


@dataclass(frozen=True)
class TimeBucket:
    start: datetime
    reward_mean: float
    pass_rate: float | None  # None: no experience in the bucket had a test result
    count: int


def reward_over_time(queryset: QuerySet[Experience]) -> tuple[str, list[TimeBucket]]:
    """Mean reward and pass rate per hour (a span of up to 2 days) or per day, latest buckets."""
    span = queryset.aggregate(oldest=Min("created_at"), newest=Max("created_at"))
    if span["oldest"] is None:
        return "hour", []
    kind = "hour" if span["newest"] - span["oldest"] <= timedelta(days=2) else "day"
    rows = (
        queryset.annotate(start=Trunc("created_at", kind))
        .values("start")
        .annotate(
            reward_mean=Avg("reward"),
            count=Count("id"),
            tested=Count("id", filter=Q(passed__isnull=False)),
            passed=Count("id", filter=Q(passed=True)),
        )
        .order_by("-start")[:MAX_TIME_BUCKETS]
    )
    buckets = [
        TimeBucket(
            start=row["start"],
            reward_mean=row["reward_mean"],
            pass_rate=row["passed"] / row["tested"] if row["tested"] else None,
            count=row["count"],
        )
        for row in rows
    ]
    return kind, buckets[::-1]


def replay_dashboard(*, agent_id: str | None = None) -> dict[str, Any]:
    """Everything the admin's replay dashboard shows, for one agent or all."""
    experiences = experience_visible(agent_ids=[agent_id] if agent_id else None)
    cycles = dream_cycle_list(agent_id=agent_id).annotate(
        td_before=Avg(Abs("items__td_error_before")),
        td_after=Avg(Abs("items__td_error_after")),
    )
    bucket_kind, buckets = reward_over_time(experiences)
    return {
        "controls": replay_controls_table(agent_id=agent_id),
        "history": replay_history(agent_id=agent_id),
        "priority_bins": histogram(experiences, "priority"),
        "td_error_bins": histogram(experiences.exclude(td_error=None), "td_error"),
        "bucket_kind": bucket_kind,
        "buckets": buckets,
        "agents": list(
            experience_visible()
            .values("agent_id")
            .annotate(n=Count("id"))
            .order_by("-n", "agent_id")
            .values_list("agent_id", "n")[:TOP_AGENTS]
        ),
        "recent_cycles": list(cycles[:RECENT_CYCLES]),
        "cycle_counts": dict(
            DreamCycle.objects.filter(**({"agent_id": agent_id} if agent_id else {}))
            .values("status")
            .annotate(n=Count("id"))
            .values_list("status", "n")
        ),
    }
