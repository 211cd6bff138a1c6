"""Reads of the replay controls: an agent's settings (its own or the REPLAY_* defaults) and its
counters."""

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Q, Sum

from .models import Experience, ReplaySettings, ReplaySnapshot, ReplayState


@dataclass(frozen=True)
class ReplayControls:
    """The replay settings in force for one agent."""

    agent_id: str
    max_size: int
    remover: str
    max_times_sampled: int
    min_size: int
    samples_per_insert: float
    spi_tolerance: float
    alpha: float
    customized: bool  # False: the agent has no row, these are the defaults

    @property
    def limited(self) -> bool:
        """The samples-per-insert rate limiter is on."""
        return self.samples_per_insert > 0

    @property
    def capped(self) -> bool:
        """Items are retired after max_times_sampled draws."""
        return self.max_times_sampled > 0


SETTING_NAMES = tuple(
    f.name for f in fields(ReplayControls) if f.name not in ("agent_id", "customized")
)


def replay_defaults() -> dict[str, object]:
    """The settings of an agent that has none of its own, from the environment."""
    return {
        "max_size": settings.REPLAY_MAX_SIZE,
        "remover": settings.REPLAY_REMOVER,
        "max_times_sampled": settings.REPLAY_MAX_TIMES_SAMPLED,
        "min_size": settings.REPLAY_MIN_SIZE,
        "samples_per_insert": settings.REPLAY_SAMPLES_PER_INSERT,
        "spi_tolerance": settings.REPLAY_SPI_TOLERANCE,
        "alpha": settings.REPLAY_ALPHA,
    }


def _controls(agent_id: str, row: ReplaySettings | None) -> ReplayControls:
    if row is None:
        return ReplayControls(agent_id=agent_id, customized=False, **replay_defaults())  # type: ignore[arg-type]
    values = {name: getattr(row, name) for name in SETTING_NAMES}
    return ReplayControls(agent_id=agent_id, customized=True, **values)


def replay_controls_many(agent_ids: Iterable[str]) -> dict[str, ReplayControls]:
    """{agent_id: its controls} in one query."""
    wanted = set(agent_ids)
    rows = ReplaySettings.objects.in_bulk(wanted) if wanted else {}
    return {agent: _controls(agent, rows.get(agent)) for agent in wanted}


def replay_controls_get(*, agent_id: str) -> ReplayControls:
    return _controls(agent_id, ReplaySettings.objects.filter(agent_id=agent_id).first())


def replay_controls_anywhere() -> bool:
    """Whether some agent has a rate limiter or a sampling cap (its own, or the defaults')."""
    if settings.REPLAY_SAMPLES_PER_INSERT > 0 or settings.REPLAY_MAX_TIMES_SAMPLED > 0:
        return True
    return ReplaySettings.objects.filter(
        Q(samples_per_insert__gt=0) | Q(max_times_sampled__gt=0)
    ).exists()


def replay_state_get(*, agent_id: str) -> ReplayState:
    """The agent's counters; all zero for an agent that never stored an experience."""
    return ReplayState.objects.filter(agent_id=agent_id).first() or ReplayState(agent_id=agent_id)


# The dashboard ---------------------------------------------------------------------------------

DASHBOARD_AGENTS = 20
HISTORY_POINTS = 48


@dataclass(frozen=True)
class AgentReplayRow:
    """One agent's line of the dashboard's controls table."""

    agent_id: str
    size: int
    max_size: int  # 0: no capacity
    removals: int
    retired: int  # retired items still in the DB (the purge deletes them)
    inserts: int
    samples: int
    samples_per_insert: float  # the limiter's ratio; 0: none
    max_times_sampled: int

    @property
    def ratio(self) -> float | None:
        return self.samples / self.inserts if self.inserts else None


@dataclass(frozen=True)
class HistoryPoint:
    at: datetime
    size: int
    inserts: int
    samples: int

    @property
    def ratio(self) -> float | None:
        return self.samples / self.inserts if self.inserts else None


def replay_controls_table(*, agent_id: str | None = None) -> list[AgentReplayRow]:
    """The largest agents' (or one agent's) size against capacity, removals, retired items and
    samples per insert."""
    states = ReplayState.objects.order_by("-size", "agent_id")
    if agent_id:
        states = states.filter(agent_id=agent_id)
    rows = list(states[:DASHBOARD_AGENTS])
    agents = [state.agent_id for state in rows]
    retired = dict(
        Experience.objects.filter(retired_at__isnull=False, agent_id__in=agents)
        .values("agent_id")
        .annotate(n=Count("id"))
        .values_list("agent_id", "n")
    )
    controls = replay_controls_many(agents)
    return [
        AgentReplayRow(
            agent_id=state.agent_id,
            size=state.size,
            max_size=controls[state.agent_id].max_size,
            removals=state.removals,
            retired=retired.get(state.agent_id, 0),
            inserts=state.inserts,
            samples=state.samples,
            samples_per_insert=controls[state.agent_id].samples_per_insert,
            max_times_sampled=controls[state.agent_id].max_times_sampled,
        )
        for state in rows
    ]


def replay_history(*, agent_id: str | None = None) -> list[HistoryPoint]:
    """The latest snapshots, oldest first: one agent's, or every agent's summed per moment."""
    snapshots = ReplaySnapshot.objects.all()
    if agent_id:
        snapshots = snapshots.filter(agent_id=agent_id)
    rows = (
        snapshots.values("at")
        .annotate(size=Sum("size"), inserts=Sum("inserts"), samples=Sum("samples"))
        .order_by("-at")[:HISTORY_POINTS]
    )
    return [HistoryPoint(r["at"], r["size"], r["inserts"], r["samples"]) for r in rows][::-1]
