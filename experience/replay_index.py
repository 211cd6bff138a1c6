"""The replay index: this process's sum trees, derived from the experience table.

One PriorityIndex per agent and one over all agents, keyed by Experience.pk, holding each
item's priority with its created and expiry times. Before every sample it catches up with the
DB from its revision cursor (see ferrum_memory.core.revisions), so edits made by any process,
the admin included, are seen on the next request. The only module that holds replay state.
"""

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import numpy.typing as npt

from ferrum_memory.core.db_functions import EpochSeconds
from ferrum_memory.core.iterables import batched
from ferrum_memory.core.revisions import revision_changes
from ferrum_memory.core.telemetry import index_catch_up

from .models import REVISION, Experience, ExperienceTombstone
from .sumtree import (
    Float64Array,
    Int64Array,
    PriorityIndex,
    SlotMap,
    importance_weights,
    sample_weights,
)

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
RETIRED = EpochSeconds("retired_at")  # NULL: sampleable
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
    # Keys this sample drew for the last time (max_times_sampled), already out of the trees:
    # the caller marks them retired in the transaction it sampled in.
    retired: list[int] = field(default_factory=list)


# {key: draws it may still have} for the keys given: the sampling cap's allowance.
Allowance = Callable[[list[int]], dict[int, int]]


def _expiry(value: float | None) -> float:
    return FOREVER if value is None else value


BUILD_CHUNK = 100_000  # rows read and turned into columns at a time


def _columns(
    rows: list[tuple], agents: dict[str, int]
) -> tuple[Int64Array, npt.NDArray[np.int32], Float64Array, Float64Array, Float64Array]:
    """ROW_FIELDS rows as numpy columns; agent ids as codes, each new one added to ``agents``."""
    count = len(rows)
    pks = np.fromiter((r[0] for r in rows), dtype=np.int64, count=count)
    code = agents.setdefault
    codes = np.fromiter((code(r[1], len(agents)) for r in rows), dtype=np.int32, count=count)
    priorities = np.fromiter((r[2] for r in rows), dtype=np.float64, count=count)
    created = np.fromiter((r[3] for r in rows), dtype=np.float64, count=count)
    expires = np.fromiter((_expiry(r[4]) for r in rows), dtype=np.float64, count=count)
    return pks, codes, priorities, created, expires


# A recency tree's weights are 2 ** ((created - reference) / half_life): an item newer than the
# reference by this many half-lives makes the tree start again from a new reference, long
# before a weight could overflow (2 ** 1024); the oldest items underflow to 0 (never drawn)
# where the O(N) draw would give them a probability below 2 ** -(1074 - 64) anyway.
REBASE_HALF_LIVES = 64
RECENCY_TREES = 2  # half-lives kept per buffer, the least recently asked dropped first


class RecencyTree:
    """One buffer's recency weights 0.5 ** (age / half_life) in a sum tree of their own, so a
    recency draw is O(batch log N) as a prioritized one is, where weighting every item on
    each draw took 20 ms at 10^6 items (0.14 ms from the tree). The weights' ratios do not
    change as time passes, so the tree holds them relative to a fixed reference time, and
    follows the buffer's inserts and removals. A draw's probabilities equal the O(N) draw's
    up to rounding."""

    def __init__(self, keys: Int64Array, created: Float64Array, half_life: float) -> None:
        self.half_life = half_life
        self.reference = float(created.max())
        self.tree = PriorityIndex(capacity=keys.shape[0])
        self.tree.build(keys, self._weights(created))

    def _weights(self, created: Float64Array) -> Float64Array:
        return np.exp2((created - self.reference) / self.half_life)

    def holds(self, created: Float64Array) -> bool:
        """Whether items created at `created` fit this tree's reference."""
        return float(created.max()) - self.reference <= REBASE_HALF_LIVES * self.half_life

    def upsert(self, keys: Int64Array, created: Float64Array) -> None:
        self.tree.upsert(keys, self._weights(created))

    def remove(self, keys: Int64Array | list[int]) -> None:
        self.tree.remove(keys)


class ReplayIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forget()

    def _forget(self) -> None:
        self._buffers: dict[str, PriorityIndex] = {}
        # {buffer: {half_life: its tree}}, built the second time a half-life is asked: a
        # client that changes it on every draw would pay a build (3x a draw) for nothing.
        self._recency: dict[str, dict[float, RecencyTree | None]] = {}
        self._next_expiry: dict[str, float] = {}
        # The agents' trees share one key -> slot table (a key is one agent's for good): one
        # table over the key range, not one per agent (at 10 agents, 60 bytes a row).
        self._agent_slots = SlotMap()
        self.cursor = -1  # -1: never built

    # Keeping up with the DB ----------------------------------------------------------------

    def catch_up(self) -> None:
        """Apply every change committed since the cursor; rebuild when that is not possible."""
        with self._lock:
            self._catch_up()

    def invalidate(self) -> None:
        """Forget everything: the next request rebuilds from the DB (after a failed write that
        this index had already applied)."""
        with self._lock:
            self._forget()

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
        if changes.rebuild:
            self._forget()
            live = changes.changed.filter(retired_at__isnull=True).values_list(*ROW_FIELDS)
            self._build(live.iterator(chunk_size=BUILD_CHUNK))  # a server-side cursor
        else:
            changed = list(changes.changed.values_list(*ROW_FIELDS, RETIRED))
            gone = list(changes.gone.values_list("experience_pk", "agent_id"))
            gone += [(row[0], row[1]) for row in changed if row[-1] is not None]
            self._apply([row for row in changed if row[-1] is None], gone)
        self.cursor = changes.upper

    def _apply(self, changed: list[tuple], gone: list[tuple[int, str]]) -> None:
        by_agent: dict[str, list[int]] = {}
        for pk, agent in gone:
            by_agent.setdefault(agent, []).append(pk)
        for agent, pks in by_agent.items():
            self._remove(agent, pks)
        if changed:
            self._upsert(changed, rebuild=False)

    def _remove(self, agent: str, keys: list[int]) -> None:
        """Remove an agent's keys from its trees and the trees over every agent."""
        for name in dict.fromkeys((agent, ALL_AGENTS)):
            if name in self._buffers:
                self._remove_from(name, keys)

    def _remove_from(self, name: str, keys: Int64Array | list[int]) -> None:
        """Remove keys from one buffer and its recency trees."""
        self._buffers[name].remove(keys)
        for tree in self._recency.get(name, {}).values():
            if tree is not None:
                tree.remove(keys)

    def _build(self, rows: Iterable[tuple]) -> None:
        """Build every tree from rows streamed in chunks: at 10^7 rows a list of row tuples took
        several GB; as numpy columns they take 36 bytes a row."""
        agents: dict[str, int] = {}
        chunks = [list(_columns(chunk, agents)) for chunk in batched(rows, BUILD_CHUNK)]
        if not chunks:
            return
        columns = []
        for i in range(len(chunks[0])):
            columns.append(np.concatenate([chunk[i] for chunk in chunks]))
            for chunk in chunks:
                chunk[i] = None  # one column's chunks at a time beside its whole: a smaller peak
        self._load(*columns, agents=list(agents), rebuild=True)

    def _upsert(self, rows: list[tuple], *, rebuild: bool) -> None:
        agents: dict[str, int] = {}
        self._load(*_columns(rows, agents), agents=list(agents), rebuild=rebuild)

    def _load(
        self,
        pks: Int64Array,
        codes: npt.NDArray[np.int32],
        priorities: Float64Array,
        created: Float64Array,
        expires: Float64Array,
        *,
        agents: list[str],
        rebuild: bool,
    ) -> None:
        """Load rows into the tree over every agent and each agent's (``codes`` index
        ``agents``): build them afresh, or upsert."""
        groups: dict[str, Int64Array | slice] = {ALL_AGENTS: slice(None)}
        for code, agent in enumerate(agents):
            groups[agent] = np.flatnonzero(codes == code)
        for name, at in groups.items():
            buffer = self._buffers.get(name)
            if buffer is None:
                shared = None if name == ALL_AGENTS else self._agent_slots
                buffer = self._buffers[name] = PriorityIndex(payload=PAYLOAD, slot_map=shared)
            load = buffer.build if rebuild else buffer.upsert
            load(pks[at], priorities[at], created=created[at], expires=expires[at])
            trees = self._recency.get(name, {})
            for half_life, tree in trees.items():
                if tree is not None and tree.holds(created[at]):
                    tree.upsert(pks[at], created[at])
                elif tree is not None:
                    trees[half_life] = None  # rebuilt, from a new reference, on its next draw
            soonest = float(expires[at].min())
            self._next_expiry[name] = min(self._next_expiry.get(name, FOREVER), soonest)

    def _drop_expired(self, name: str, now: float) -> None:
        """Expired items are never sampled, even before the purge task deletes them."""
        if now < self._next_expiry.get(name, FOREVER):
            return
        buffer = self._buffers[name]
        keys, _ = buffer.items()
        expires = buffer.payload("expires")
        self._remove_from(name, keys[expires <= now])
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
        allowance: Allowance | None = None,
    ) -> ReplaySample:
        """Draw `batch_size` keys with replacement, with their probabilities and IS weights.

        With `allowance` (the sampling cap) no key is drawn more often than it allows: a draw
        that uses up a key's allowance retires it, and the rest of the batch is drawn from the
        buffer without it (so each draw's probability and weight are those of the buffer it
        was drawn from). The caller holds the revision lock then (revision_lock)."""
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
            draw = partial(
                self._draw,
                name,
                buffer,
                strategy=strategy,
                rng=rng,
                exponent=alpha / configured_alpha,
                stratified=stratified,
                half_life=half_life,
            )
            if allowance is not None:
                return self._sample_capped(name, buffer, draw, batch_size, beta, allowance)
            keys, probabilities, min_p = draw(batch_size)
        return ReplaySample(
            keys=keys,
            probabilities=probabilities,
            weights=importance_weights(probabilities, size, beta, min_p),
            buffer_size=size,
        )

    def _draw(
        self,
        name: str,
        buffer: PriorityIndex,
        batch_size: int,
        *,
        strategy: str,
        rng: np.random.Generator,
        exponent: float,
        stratified: bool,
        half_life: float,
    ) -> tuple[Int64Array, Float64Array, float]:
        """Keys, their probabilities and the buffer's smallest probability (the IS-weight
        normaliser)."""
        if strategy == "prioritized":
            return self._sample_prioritized(buffer, batch_size, rng, exponent, stratified)
        if strategy == "uniform":
            keys, probabilities = buffer.sample_uniform(batch_size, rng)
            return keys, probabilities, 1.0 / len(buffer)
        if strategy != "recency":
            raise ValueError(f"unknown replay strategy {strategy!r}")
        tree = self._recency_tree(name, buffer, half_life)
        if tree is not None:
            keys, probabilities = tree.tree.sample(batch_size, rng)
            return keys, probabilities, tree.tree.min_probability()
        all_keys, _ = buffer.items()
        created = buffer.payload("created")
        # 0.5 ** (age / half_life), relative to the newest item to stay in range.
        weights = np.exp2((created - created.max()) / half_life)
        keys, probabilities = sample_weights(batch_size, rng, all_keys, weights)
        return keys, probabilities, float(weights[weights > 0].min() / weights.sum())

    def _recency_tree(
        self, name: str, buffer: PriorityIndex, half_life: float
    ) -> RecencyTree | None:
        """The buffer's tree for `half_life`, built if this half-life was asked before; None
        the first time (that draw weights every item)."""
        trees = self._recency.setdefault(name, {})
        if half_life not in trees:
            trees[half_life] = None
            while len(trees) > RECENCY_TREES:
                del trees[next(iter(trees))]
            return None
        tree = trees.pop(half_life)  # put back last: the most recently asked
        if tree is None or not tree.tree.total() > 0:
            keys, _ = buffer.items()
            tree = RecencyTree(keys, buffer.payload("created"), half_life)
        trees[half_life] = tree
        return tree

    def _sample_capped(
        self,
        name: str,
        buffer: PriorityIndex,
        draw: Callable[[int], tuple[Int64Array, Float64Array, float]],
        batch_size: int,
        beta: float,
        allowance: Allowance,
    ) -> ReplaySample:
        """Draw in rounds: each round's draws are kept up to the first that retires a key (or
        would draw a key already at its cap); the key leaves the trees and the next round draws
        the rest. Discarding the later draws of a round biases nothing: they are independent
        of the kept ones. A batch is shorter when the cap retires every item."""
        left: dict[int, int] = {}
        kept: list[tuple[Int64Array, Float64Array, Float64Array]] = []
        retired: list[int] = []
        first_size = len(buffer)
        need = batch_size
        while need and len(buffer):
            size = len(buffer)
            try:
                keys, probabilities, min_p = draw(need)
            except BufferTooSmall:
                if kept:
                    break
                raise
            drawn = keys.tolist()
            left.update(allowance([key for key in set(drawn) if key not in left]))
            cut, gone = len(drawn), None
            for i, key in enumerate(drawn):
                if left[key] <= 0:  # over a cap lowered since it was drawn: retire, undrawn
                    cut, gone = i, key
                    break
                left[key] -= 1
                if left[key] == 0:
                    cut, gone = i + 1, key
                    break
            if cut:
                p = probabilities[:cut]
                kept.append((keys[:cut], p, importance_weights(p, size, beta, min_p)))
            if gone is not None:
                retired.append(gone)
                self._remove(name, [gone])
            need -= cut
        if not kept:
            raise BufferTooSmall(0)
        return ReplaySample(
            keys=np.concatenate([k for k, _, _ in kept]),
            probabilities=np.concatenate([p for _, p, _ in kept]),
            weights=np.concatenate([w for _, _, w in kept]),
            buffer_size=first_size,
            retired=retired,
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
