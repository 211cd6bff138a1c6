"""The replay index: this process's sum trees, derived from the experience table.

One PriorityIndex per agent and one over all agents, keyed by Experience.pk, holding each
item's priority with its created and expiry times. Before every sample it catches up with the
DB from its revision cursor (see ferrum_memory.core.revisions), so edits made by any process,
the admin included, are seen on the next request. The only module that holds replay state.
"""

import threading
import time
from dataclasses import dataclass

import numpy as np

from ferrum_memory.core.db_functions import EpochSeconds
from ferrum_memory.core.revisions import revision_changes
from ferrum_memory.core.telemetry import index_catch_up

from .models import REVISION, Experience, ExperienceTombstone
from .sumtree import Float64Array, Int64Array, PriorityIndex, importance_weights, sample_weights

ALL_AGENTS = ""  # the buffer key of the tree over every agent
PAYLOAD = ("created", "expires")
# Times as epoch seconds computed by the DB: parsing 10^6 timestamps into datetimes in Python
# took 11 s of a rebuild.
ROW_FIELDS = (
    "id",
    "agent_id",
    "priority",
    EpochSeconds("created_at"),
    EpochSeconds("expires_at"),  # NULL: never expires
)
FOREVER = np.inf


class BufferTooSmall(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


@dataclass(frozen=True)
class ReplaySample:
    keys: Int64Array
    probabilities: Float64Array
    weights: Float64Array
    buffer_size: int


def _expiry(value: float | None) -> float:
    return FOREVER if value is None else value


class ReplayIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[str, PriorityIndex] = {}
        self._next_expiry: dict[str, float] = {}
        self.cursor = -1  # -1: never built

    # Keeping up with the DB ----------------------------------------------------------------

    def catch_up(self) -> None:
        """Apply every change committed since the cursor; rebuild when that is not possible."""
        with self._lock:
            self._catch_up()

    @index_catch_up(REVISION)
    def _catch_up(self) -> None:
        changes = revision_changes(
            name=REVISION,
            cursor=self.cursor,
            rows=Experience.objects.all(),
            tombstones=ExperienceTombstone.objects.all(),
        )
        if changes is None:
            return
        changed = list(changes.changed.values_list(*ROW_FIELDS))
        if changes.rebuild:
            self._buffers = {}
            self._next_expiry = {}
            if changed:
                self._upsert(changed, rebuild=True)
        else:
            self._apply(changed, list(changes.gone.values_list("experience_pk", "agent_id")))
        self.cursor = changes.upper

    def _apply(self, changed: list[tuple], gone: list[tuple[int, str]]) -> None:
        by_agent: dict[str, list[int]] = {}
        for pk, agent in gone:
            by_agent.setdefault(agent, []).append(pk)
        for agent, pks in by_agent.items():
            for name in (agent, ALL_AGENTS):
                if name in self._buffers:
                    self._buffers[name].remove(pks)
        if changed:
            self._upsert(changed, rebuild=False)

    def _upsert(self, rows: list[tuple], *, rebuild: bool) -> None:
        pks = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        priorities = np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows))
        created = np.fromiter((r[3] for r in rows), dtype=np.float64, count=len(rows))
        expires = np.fromiter((_expiry(r[4]) for r in rows), dtype=np.float64, count=len(rows))
        agents = np.array([r[1] for r in rows], dtype=object)
        groups: dict[str, np.ndarray] = {ALL_AGENTS: np.arange(len(rows))}
        for agent in set(agents.tolist()):
            groups[agent] = np.flatnonzero(agents == agent)
        for name, at in groups.items():
            buffer = self._buffers.setdefault(name, PriorityIndex(payload=PAYLOAD))
            load = buffer.build if rebuild else buffer.upsert
            load(pks[at], priorities[at], created=created[at], expires=expires[at])
            soonest = float(expires[at].min())
            self._next_expiry[name] = min(self._next_expiry.get(name, FOREVER), soonest)

    def _drop_expired(self, name: str, now: float) -> None:
        """Expired items are never sampled, even before the purge task deletes them."""
        if now < self._next_expiry.get(name, FOREVER):
            return
        buffer = self._buffers[name]
        keys, _ = buffer.items()
        expires = buffer.payload("expires")
        buffer.remove(keys[expires <= now])
        remaining = expires[expires > now]
        self._next_expiry[name] = float(remaining.min()) if remaining.size else FOREVER

    # Sampling -----------------------------------------------------------------------------

    def priorities(self, agent_id: str | None = None) -> dict[int, float]:
        """What this process would sample from: {pk: priority} (for checks and tests)."""
        buffer = self._buffers.get(agent_id or ALL_AGENTS)
        if buffer is None:
            return {}
        keys, priorities = buffer.items()
        return dict(zip(keys.tolist(), priorities.tolist(), strict=True))

    def sample(
        self,
        *,
        strategy: str,
        batch_size: int,
        rng: np.random.Generator,
        agent_id: str | None = None,
        alpha: float,
        configured_alpha: float,
        beta: float,
        half_life: float,
        min_size: int = 1,
        stratified: bool = False,
        now: float | None = None,
    ) -> ReplaySample:
        now = time.time() if now is None else now
        name = agent_id or ALL_AGENTS
        with self._lock:
            self._catch_up()
            buffer = self._buffers.get(name)
            if buffer is not None:
                self._drop_expired(name, now)
            size = 0 if buffer is None else len(buffer)
            if size < min_size or size == 0:
                raise BufferTooSmall(size)
            assert buffer is not None
            if strategy == "prioritized":
                keys, probabilities, min_p = self._sample_prioritized(
                    buffer, batch_size, rng, alpha / configured_alpha, stratified
                )
            else:
                all_keys, _ = buffer.items()
                if strategy == "recency":
                    created = buffer.payload("created")
                    # 0.5 ** (age / half_life), relative to the newest item to stay in range.
                    weights = np.exp2((created - created.max()) / half_life)
                else:
                    weights = np.ones(size)
                keys, probabilities = sample_weights(batch_size, rng, all_keys, weights)
                min_p = float(weights[weights > 0].min() / weights.sum())
        return ReplaySample(
            keys=keys,
            probabilities=probabilities,
            weights=importance_weights(probabilities, size, beta, min_p),
            buffer_size=size,
        )

    @staticmethod
    def _sample_prioritized(
        buffer: PriorityIndex,
        batch_size: int,
        rng: np.random.Generator,
        exponent: float,
        stratified: bool,
    ) -> tuple[Int64Array, Float64Array, float]:
        if buffer.total() <= 0:
            raise BufferTooSmall(0)  # every priority is 0: nothing may be sampled
        if exponent == 1.0:
            keys, probabilities = buffer.sample(batch_size, rng, stratified=stratified)
        else:  # an alpha other than the configured one: exact, O(N)
            keys, probabilities = buffer.sample_powered(batch_size, rng, exponent)
        return keys, probabilities, buffer.min_probability(exponent)


_index: ReplayIndex | None = None
_index_lock = threading.Lock()


def get_replay_index() -> ReplayIndex:
    global _index
    with _index_lock:
        if _index is None:
            _index = ReplayIndex()
        return _index


def reset_replay_index() -> None:
    """Forget this process's index (tests); the next request rebuilds it from the DB."""
    global _index
    with _index_lock:
        _index = None
