"""In-process replay index: a vectorized numpy sum tree for prioritized experience replay.

Pure numpy, no Django: the index is a cache derived from the database (DESIGN.md, "The one idea"),
keyed by experience primary keys, and can be rebuilt from rows at any time with ``build``.

Stored priorities are already the PER ``p_i = (|delta_i| + eps) ** alpha``; this module only
samples ``P(i) = p_i / sum_k p_k`` and computes importance-sampling weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt

__all__ = ["PriorityIndex", "importance_weights", "sample_weights"]

KeysLike = Sequence[int] | npt.NDArray[np.integer]
Int64Array = npt.NDArray[np.int64]
Float64Array = npt.NDArray[np.float64]


def _as_keys(keys: KeysLike) -> Int64Array:
    arr = np.asarray(keys)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    # Refuse floats: np.asarray(..., dtype=int64) would silently truncate 1.5 to 1.
    if arr.dtype.kind not in "iu":
        raise TypeError(f"keys must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False).ravel()


def _as_weights(values: npt.ArrayLike, n: int, what: str) -> Float64Array:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.shape[0] != n:
        raise ValueError(f"{n} keys but {arr.shape[0]} {what}")
    # Two reductions tell it all: NaN fails both comparisons, -inf the first, inf the second.
    if n and not (arr.min() >= 0 and arr.max() < np.inf):
        raise ValueError(f"{what} must be finite and >= 0")
    return arr


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _capacity_for(count: int) -> int:
    """The smallest capacity of at least ``count`` slots that the levels divide evenly: a
    multiple of FAN ** k, where k levels of FAN take it to at most FLAT_SEARCH nodes under the
    root. Not a power of two, which left up to half of every per-slot array unused."""
    step = 1
    while count > FLAT_SEARCH * step:
        step *= FAN
    return max(1, -(-count // step) * step)


GROWTH = 1.25  # a full index grows by this factor: amortized O(1) per insert, little unused


def _last_wins(keys: Int64Array) -> Int64Array | None:
    """Positions of the last occurrence of each distinct key; None when all are distinct."""
    ordered = keys.copy()
    ordered.sort()
    # Methods, not np.sort/np.all: their Python wrappers cost as much as the work at 256 keys.
    if not (ordered[1:] == ordered[:-1]).any():
        return None  # the usual case, told for a tenth of np.unique's cost
    # np.unique returns the first occurrence; on the reversed arrays that is the last one.
    _, first_in_reversed = np.unique(keys[::-1], return_index=True)
    return keys.shape[0] - 1 - first_in_reversed


FAN = 16  # children per node below the root (a power of two): 3 levels over 10^6, not 20
FLAT_SEARCH = 4096  # the root's children: at most this many, searched in one binary search


# What each internal node keeps of its children: their sum, max and smallest positive value
# (inf when none; leaves of 0 count as none).
COMBINE = (np.add, np.maximum, np.minimum)


class SlotMap:
    """int64 key -> slot. Keys are database primary keys, dense and growing, so they live in a
    direct-address table over a window of keys (a gather per lookup: a dict took 0.5 us a key
    at 10^6 and ~100 bytes each); keys the window cannot cover densely go to a dict. Several
    PriorityIndex may share one when their keys are disjoint (each key in one index only)."""

    DENSITY = 16  # the window may span up to this many keys per mapped key (4 bytes a key)

    def __init__(self) -> None:
        self._base = 0
        self._table = np.empty(0, dtype=np.int32)  # slot of key base + i, or -1
        self._extra: dict[int, int] = {}
        self._count = 0
        self._widen_at = 0  # the dict's size at which to try widening the window again

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, int | np.integer) or not -(2**63) <= key < 2**63:
            return False
        return bool(self.get(np.array([key], dtype=np.int64))[0] >= 0)

    def _inside(self, keys: Int64Array) -> npt.NDArray[np.bool_]:
        return (keys >= self._base) & (keys < self._base + self._table.shape[0])

    def get(self, keys: Int64Array) -> Int64Array:
        """Slots of ``keys``, -1 for a key not mapped."""
        offsets = keys - self._base
        if keys.shape[0] and offsets.min() >= 0 and offsets.max() < self._table.shape[0]:
            return self._table[offsets].astype(np.int64)  # all in the window: one gather
        slots = np.full(keys.shape[0], -1, dtype=np.int64)
        inside = self._inside(keys)
        slots[inside] = self._table[keys[inside] - self._base]
        if self._extra:
            outside = np.flatnonzero(~inside)
            found = map(self._extra.get, keys[outside].tolist(), repeat(-1))
            slots[outside] = np.fromiter(found, dtype=np.int64, count=outside.shape[0])
        return slots

    def add(self, keys: Int64Array, slots: Int64Array) -> None:
        """Map distinct keys not mapped yet."""
        self._count += keys.shape[0]
        inside = self._inside(keys)
        outside = keys.shape[0] - int(np.count_nonzero(inside))
        # After a window found too sparse to widen, wait until the dict's keys double: each
        # try is O(window), so keys that stay sparse cost amortized O(1) each.
        if outside and len(self._extra) + outside >= self._widen_at:
            if not self._widen(int(keys.min()), int(keys.max())):
                self._widen_at = 2 * (len(self._extra) + outside)
            inside = self._inside(keys)
        self._table[keys[inside] - self._base] = slots[inside]
        if not inside.all():
            self._extra.update(zip(keys[~inside].tolist(), slots[~inside].tolist(), strict=True))

    def _widen(self, low: int, high: int) -> bool:
        """Cover ``[low, high]`` with the window if it stays dense enough, with room to grow
        upwards (new rows get larger keys); drop the dead keys below the first live one."""
        live = np.flatnonzero(self._table >= 0)
        if live.shape[0]:
            low = min(low, self._base + int(live[0]))
            high = max(high, self._base + int(live[-1]))
        if self._extra:
            low, high = min(low, *self._extra), max(high, *self._extra)
        span = high - low + 1
        if span > self.DENSITY * self._count + 4096:
            return False  # too sparse: what falls outside goes to the dict
        table = np.full(span + span // 2, -1, dtype=np.int32)
        table[self._base + live - low] = self._table[live]
        extra, self._extra = self._extra, {}
        self._base, self._table = low, table
        if extra:
            keys = np.fromiter(extra, dtype=np.int64, count=len(extra))
            self._table[keys - low] = np.fromiter(extra.values(), dtype=np.int64, count=len(extra))
        return True

    def remove(self, keys: Int64Array) -> Int64Array:
        """Unmap distinct keys; the slots of those that were mapped."""
        slots = self.get(keys)
        mapped = slots >= 0
        keys, slots = keys[mapped], slots[mapped]
        inside = self._inside(keys)
        self._table[keys[inside] - self._base] = -1
        for key in keys[~inside].tolist():
            del self._extra[key]
        self._count -= keys.shape[0]
        return slots


class PriorityIndex:
    """Sum tree (with max and min) over non-negative priorities, keyed by int64 keys.

    Slot ``s`` holds one key's priority in ``_leaves[s]``; ``capacity`` is the number of slots
    (see _capacity_for). Each internal node sums ``FAN`` children (fewer at the top when the
    capacity is small) and keeps their max and their smallest positive value (inf: none):
    ``_levels[d]`` is a (3, width) array, its rows the sums, maxima and minima of level ``d``,
    level 0 just above the leaves and the last level the root. Node ``p`` of a
    level has children ``p * fan .. p * fan + fan - 1`` on the level below (the root has up to
    FLAT_SEARCH: a sample finds its child by one binary search). Internal nodes are
    always recomputed from their children, never adjusted by a delta, so the tree cannot
    drift from the leaves however many updates it sees. A wide tree has a quarter of a binary
    tree's levels, so an update or a sample makes a quarter of the numpy calls, and it holds
    1.07 nodes per slot instead of 2.

    ``payload`` names float columns stored beside each key (the replay index keeps created and
    expiry times there), given to ``upsert``/``build`` and read back by ``payload(name)``.
    """

    def __init__(
        self,
        capacity: int = 1024,
        *,
        payload: Sequence[str] = (),
        slot_map: SlotMap | None = None,
    ) -> None:
        self._payload_names = tuple(payload)
        # Indexes over disjoint sets of keys may share one slot map (the replay index's
        # per-agent trees): one table over the key range instead of one per index.
        self._slot_of = SlotMap() if slot_map is None else slot_map
        self._size = 0
        self._free: list[int] = []  # freed slots, reused before fresh ones
        self._next = 0  # slots [0, _next) have been handed out at least once
        self._allocate(_capacity_for(capacity))

    def _allocate(self, capacity: int) -> None:
        self._cap = capacity
        self._leaves = np.zeros(capacity, dtype=np.float64)
        self._fans: list[int] = []  # children per node of each level, from the leaves up
        widths = []
        width = capacity
        while not self._fans or width > 1:
            # The root takes a whole level of at most FLAT_SEARCH nodes as its children: a
            # sample searches them flat, and nothing else reads the levels a narrower fan
            # would put between them and the root.
            fan = width if width <= FLAT_SEARCH else FAN
            width //= fan
            self._fans.append(fan)
            widths.append(width)
        # Level d is one (3, width) array: rows sum, max and min, so one take, one copy and one
        # put serve all three.
        self._levels = [np.zeros((3, w)) for w in widths]
        for level in self._levels:
            level[2] = np.inf
        # Each node's run of children as one item, so one take gathers every node's children:
        # of all three rows, and of the sums alone (what a sample reads).
        self._runs = [
            below.view(np.dtype((np.void, 8 * fan)))
            for below, fan in zip([self._leaves, *self._levels[:-1]], self._fans, strict=True)
        ]
        self._sum_runs = [self._runs[0]] + [
            level[0].view(np.dtype((np.void, 8 * fan)))
            for level, fan in zip(self._levels[:-1], self._fans[1:], strict=True)
        ]
        self._keys = np.zeros(capacity, dtype=np.int64)
        self._live = np.zeros(capacity, dtype=bool)
        self._payload = {name: np.zeros(capacity) for name in self._payload_names}

    def _children_of(self, depth: int, nodes: Int64Array, *, sums: bool = False) -> Float64Array:
        """The children of ``nodes`` of level ``depth``, child-major: (fan, n) leaves or sums
        (``sums``), else (3, fan, n) rows. One take of whole runs, then a transposing copy:
        reducing the first axis is elementwise work, several times faster than the last."""
        fan, n = self._fans[depth], nodes.shape[0]
        if depth == 0 or sums:
            block = self._sum_runs[depth].take(nodes).view(np.float64)
            return block.reshape(n, fan).T.copy()
        block = self._runs[depth].take(nodes, axis=1).view(np.float64)
        return block.reshape(3, n, fan).transpose(0, 2, 1).copy()

    def _combine(self, children: Float64Array, out: Float64Array) -> None:
        """Sum, max and smallest positive of (fan, n) leaves or (3, fan, n) rows into the rows
        of ``out`` (3, n). The same reductions serve whole levels and single nodes."""
        if children.ndim == 2:
            np.add.reduce(children, axis=0, out=out[0])
            np.maximum.reduce(children, axis=0, out=out[1])
            np.minimum.reduce(children, axis=0, out=out[2], where=children > 0, initial=np.inf)
        else:
            for row, combine in enumerate(COMBINE):
                combine.reduce(children[row], axis=0, out=out[row])

    def _recompute_level(self, depth: int) -> None:
        """Recompute the whole of level ``depth`` from the level below."""
        fan = self._fans[depth]
        children: Float64Array
        if depth == 0:
            children = self._leaves.reshape(-1, fan).T
        else:
            children = self._levels[depth - 1].reshape(3, -1, fan).transpose(0, 2, 1)
        self._combine(children, self._levels[depth])

    def _rebuild_internal(self) -> None:
        """Recompute every internal level from the leaves up: O(capacity)."""
        for depth in range(len(self._fans)):
            self._recompute_level(depth)

    def _grow(self, needed_slots: int) -> None:
        old_cap, old_leaves = self._cap, self._leaves
        old_keys, old_live, old_payload = self._keys, self._live, self._payload
        self._allocate(_capacity_for(max(needed_slots, int(self._cap * GROWTH))))
        self._leaves[:old_cap] = old_leaves
        self._keys[:old_cap] = old_keys
        self._live[:old_cap] = old_live
        for name, column in old_payload.items():
            self._payload[name][:old_cap] = column
        self._rebuild_internal()

    def _set_leaves(self, slots: Int64Array, values: Float64Array) -> None:
        """Write leaf values, then recompute their ancestors level by level: per quantity, one
        gather of the nodes' children, one reduction, one scatter. Every child is final before
        its parent is recomputed; a parent listed twice is written twice with one value."""
        self._leaves[slots] = values
        nodes = slots
        out = np.empty((3, slots.shape[0]))
        for depth, fan in enumerate(self._fans):
            if self._levels[depth].shape[1] <= nodes.shape[0]:
                # A level no wider than the batch: whole, without gathers, and so are those above.
                for top in range(depth, len(self._fans)):
                    self._recompute_level(top)
                return
            nodes = nodes >> (fan.bit_length() - 1)  # a level below the root: fan is FAN, 16
            self._combine(self._children_of(depth, nodes), out)
            level = self._levels[depth]
            for row in range(3):  # three 1-D scatters take 60% of one 2-D scatter's time
                level[row, nodes] = out[row]

    def _as_payload(self, n: int, given: dict[str, npt.ArrayLike]) -> dict[str, Float64Array]:
        if set(given) != set(self._payload_names):
            raise ValueError(f"payload must be exactly {self._payload_names}, got {tuple(given)}")
        columns = {
            name: np.asarray(values, dtype=np.float64).ravel() for name, values in given.items()
        }
        if any(column.shape[0] != n for column in columns.values()):
            raise ValueError(f"{n} keys but payload columns of other lengths")
        return columns

    def upsert(self, keys: KeysLike, priorities: npt.ArrayLike, **payload: npt.ArrayLike) -> None:
        """Insert or update; priorities must be finite and >= 0. Duplicate keys: last wins."""
        k = _as_keys(keys)
        p = _as_weights(priorities, k.shape[0], "priorities")
        columns = self._as_payload(k.shape[0], payload)
        if k.shape[0] == 0:
            return
        last = _last_wins(k)
        if last is not None:
            k, p = k[last], p[last]
            columns = {name: column[last] for name, column in columns.items()}
        slots = self._slot_of.get(k)
        if slots.min() < 0:  # an update of known keys, the usual case, skips this
            new = np.flatnonzero(slots < 0)
            slots[new] = self._take_slots(new.size)
            self._keys[slots[new]] = k[new]
            self._live[slots[new]] = True
            self._slot_of.add(k[new], slots[new])
            self._size += new.size
        for name, column in columns.items():
            self._payload[name][slots] = column
        self._set_leaves(slots, p)

    def _take_slots(self, count: int) -> Int64Array:
        reused = self._free[-count:] if count <= len(self._free) else list(self._free)
        del self._free[len(self._free) - len(reused) :]
        fresh = count - len(reused)
        if self._next + fresh > self._cap:
            self._grow(self._next + fresh)
        taken = np.concatenate(
            [np.asarray(reused, dtype=np.int64), np.arange(self._next, self._next + fresh)]
        )
        self._next += fresh
        return taken

    def remove(self, keys: KeysLike) -> None:
        """Remove keys; unknown keys are ignored. Freed slots get priority 0 and are reused."""
        slots = self._slot_of.remove(np.unique(_as_keys(keys)))
        if not slots.size:
            return
        self._size -= slots.size
        self._live[slots] = False
        self._set_leaves(slots, np.zeros(slots.shape[0]))
        self._free.extend(slots.tolist())

    def build(self, keys: KeysLike, priorities: npt.ArrayLike, **payload: npt.ArrayLike) -> None:
        """Replace the whole content in O(N) (no per-level walk per key). Duplicates: last wins."""
        k = _as_keys(keys)
        p = _as_weights(priorities, k.shape[0], "priorities")
        columns = self._as_payload(k.shape[0], payload)
        last = _last_wins(k)
        if last is not None:
            k, p = k[last], p[last]
            columns = {name: column[last] for name, column in columns.items()}
        n = k.shape[0]
        old_keys = self.keys_array()
        self._allocate(_capacity_for(max(n, self._cap)))
        self._leaves[:n] = p
        self._keys[:n] = k
        self._live[:n] = True
        for name, column in columns.items():
            self._payload[name][:n] = column
        self._rebuild_internal()
        self._slot_of.remove(old_keys)  # this index's keys only: the map may be shared
        self._slot_of.add(k, np.arange(n, dtype=np.int64))
        self._size = n
        self._free = []
        self._next = n

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: object) -> bool:
        if key not in self._slot_of:
            return False
        return bool(self._owned(np.array([key], dtype=np.int64))[0] >= 0)

    def _owned(self, keys: Int64Array) -> Int64Array:
        """Slots of ``keys`` in this index, -1 for a key it does not hold (a shared slot map
        also maps other indexes' keys)."""
        slots = self._slot_of.get(keys)
        mine = (slots >= 0) & (slots < self._cap)
        at = slots[mine]
        mine[mine] = self._live[at] & (self._keys[at] == keys[mine])
        return np.where(mine, slots, -1)

    @property
    def capacity(self) -> int:
        """Current number of slots (grows by GROWTH when full)."""
        return self._cap

    def _root(self, quantity: int) -> float:
        return float(self._levels[-1][quantity, 0])

    def total(self) -> float:
        """Sum of all priorities."""
        return self._root(0)

    def max_priority(self) -> float:
        """Largest priority (0.0 when empty); new items without a TD error get this. O(1)."""
        return self._root(1)

    def min_priority(self) -> float:
        """Smallest *positive* priority (0.0 when there is none). O(1)."""
        low = self._root(2)
        return low if math.isfinite(low) else 0.0

    def min_probability(self, exponent: float = 1.0) -> float:
        """Smallest non-zero sampling probability, the IS-weight normaliser.

        O(1) for ``exponent == 1`` (the distribution ``sample`` uses); O(N) otherwise, matching
        ``sample_powered``. 0.0 when nothing can be sampled.
        """
        if exponent == 1.0:
            total = self.total()
            return self.min_priority() / total if total > 0 else 0.0
        weights = self._powered_weights(self.items()[1], exponent)
        total = float(weights.sum())
        return float(weights[weights > 0].min()) / total if total > 0 else 0.0

    def priorities(self, keys: KeysLike) -> Float64Array:
        """Stored priorities of ``keys``; raises KeyError for an unknown key."""
        k = _as_keys(keys)
        slots = self._owned(k)
        if np.any(slots < 0):
            raise KeyError(int(k[np.argmax(slots < 0)]))
        return self._leaves[slots]

    def keys_array(self) -> Int64Array:
        """Live keys, in slot order."""
        return self.items()[0]

    def items(self) -> tuple[Int64Array, Float64Array]:
        """Live keys and their priorities, in slot order."""
        slots = self._live_slots()
        return self._keys[slots], self._leaves[slots]

    def payload(self, name: str) -> Float64Array:
        """A payload column of the live keys, in the order of ``items()``."""
        return self._payload[name][self._live_slots()]

    def _live_slots(self) -> Int64Array:
        return np.flatnonzero(self._live[: self._next])

    def _check_sampleable(self) -> float:
        if not self._size:
            raise ValueError("cannot sample from an empty replay index")
        total = self.total()
        if not total > 0:
            raise ValueError("cannot sample: every priority in the replay index is 0")
        return total

    def _descend(self, u: Float64Array) -> Int64Array:
        """Map prefix-sum targets ``u`` in ``[0, total]`` to slots.

        The walk takes the first entry whose running sum exceeds ``u``: that entry's sum is
        positive, so no walk enters a subtree holding nothing. When rounding leaves ``u`` at or
        past the running total, it takes the last entry with a positive sum. The root's many
        children are one binary search; below them the walk goes down a level at a time."""
        top = len(self._fans) - 1  # the root's level
        sums = self._leaves if top == 0 else self._levels[top - 1][0]
        running = np.cumsum(sums)
        nodes = np.searchsorted(running, u, side="right")
        over = nodes == sums.shape[0]
        if over.any():  # float edge, rare
            nodes[over] = np.flatnonzero(sums > 0)[-1]
        u = np.where(nodes > 0, u - running[nodes - 1], u)
        columns = np.arange(u.shape[0])
        for depth in range(top - 1, -1, -1):
            sums = self._children_of(depth, nodes, sums=True)  # (fan, n)
            running = np.cumsum(sums, axis=0)
            child = np.count_nonzero(running <= u, axis=0)
            over = child == sums.shape[0]
            if over.any():  # float edge, rare
                positive = sums[:, over] > 0
                child[over] = sums.shape[0] - 1 - np.argmax(positive[::-1], axis=0)
            u = np.where(child > 0, u - running[child - 1, columns], u)
            nodes = nodes * sums.shape[0] + child
        return nodes

    def sample(
        self, batch_size: int, rng: np.random.Generator, *, stratified: bool = False
    ) -> tuple[Int64Array, Float64Array]:
        """Draw ``batch_size`` keys with replacement, ``P(i) = p_i / total``.

        Returns the keys and their probabilities. Stratified draws one target per equal segment
        of ``[0, total)``, which lowers variance but keeps each draw's marginal P(i).
        """
        _check_batch_size(batch_size)
        total = self._check_sampleable()
        if stratified:
            u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        else:
            u = rng.random(batch_size) * total
        slots = self._descend(u)
        return self._keys[slots], self._leaves[slots] / total

    def sample_uniform(
        self, batch_size: int, rng: np.random.Generator
    ) -> tuple[Int64Array, Float64Array]:
        """Draw ``batch_size`` live keys with replacement, each with P(i) = 1 / N, whatever its
        priority. O(batch) while at least half the slots handed out are live: a slot drawn
        among them is drawn again while it is free, so each live one is equally likely.
        Otherwise the live slots are listed (O(N))."""
        _check_batch_size(batch_size)
        if not self._size:
            raise ValueError("cannot sample from an empty replay index")
        if 2 * self._size >= self._next:
            slots = rng.integers(0, self._next, batch_size)
            free = np.flatnonzero(~self._live[slots])
            while free.size:
                slots[free] = rng.integers(0, self._next, free.size)
                free = free[~self._live[slots[free]]]
        else:
            live = self._live_slots()
            slots = live[rng.integers(0, live.shape[0], batch_size)]
        return self._keys[slots], np.full(batch_size, 1.0 / self._size)

    @staticmethod
    def _powered_weights(priorities: Float64Array, exponent: float) -> Float64Array:
        if not (math.isfinite(exponent) and exponent >= 0):
            raise ValueError(f"exponent must be finite and >= 0, got {exponent}")
        top = priorities.max(initial=0.0)
        if top <= 0:
            return np.zeros_like(priorities)
        # Scale by the max first so a large exponent cannot overflow; zero stays zero even
        # for exponent 0 (a zero priority means "never sample", whatever the alpha).
        return np.where(priorities > 0, (priorities / top) ** exponent, 0.0)

    def sample_powered(
        self, batch_size: int, rng: np.random.Generator, exponent: float
    ) -> tuple[Int64Array, Float64Array]:
        """Sample with weights ``p_i ** exponent`` (exact, O(N)): a request's alpha / alpha0."""
        _check_batch_size(batch_size)
        self._check_sampleable()
        keys, priorities = self.items()
        return sample_weights(batch_size, rng, keys, self._powered_weights(priorities, exponent))


def sample_weights(
    batch_size: int, rng: np.random.Generator, keys: KeysLike, weights: npt.ArrayLike
) -> tuple[Int64Array, Float64Array]:
    """Sample keys with replacement, P(i) = w_i / sum(w), in O(N) (cumsum + searchsorted).

    For weights that change with time (recency), where a tree would have to be rewritten on
    every request anyway. Zero-weight keys are never drawn.
    """
    _check_batch_size(batch_size)
    k = _as_keys(keys)
    w = _as_weights(weights, k.shape[0], "weights")
    if k.shape[0] == 0:
        raise ValueError("cannot sample from an empty set of keys")
    cdf = np.cumsum(w)
    total = float(cdf[-1])
    if not total > 0:
        raise ValueError("cannot sample: every weight is 0")
    # Keep u strictly below total so side="right" always lands on a positive-weight entry.
    u = np.minimum(rng.random(batch_size) * total, np.nextafter(total, 0.0))
    idx = np.searchsorted(cdf, u, side="right")
    return k[idx], w[idx] / total


def importance_weights(
    probabilities: npt.ArrayLike, n: int, beta: float, min_probability: float
) -> Float64Array:
    """PER importance-sampling weights ``w_i = (N P(i))^-beta / max_j w_j``.

    Schaul et al. 2015 (section 3.4) "always normalize weights by 1/max_i w_i so that they only
    scale the update downwards". We take that max over the whole buffer, not just the batch
    (as OpenAI baselines and cpprb do): it is attained at the smallest probability in the
    buffer, so the normaliser is ``(N * min_probability)^-beta``. A batch's weights then do not
    depend on which other items were drawn with them, and all lie in (0, 1]. Pass
    ``PriorityIndex.min_probability()`` (same exponent as the draw) as ``min_probability``.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    if not (math.isfinite(min_probability) and min_probability > 0):
        raise ValueError(f"min_probability must be finite and > 0, got {min_probability}")
    if not np.all(np.isfinite(p) & (p > 0)):
        raise ValueError("probabilities must be finite and > 0")
    # (N p)^-beta / (N p_min)^-beta == (p_min / p)^beta: N cancels, and the ratio form avoids
    # the overflow of (N p)^-beta for tiny p and large beta.
    return np.asarray((min_probability / p) ** beta, dtype=np.float64)
