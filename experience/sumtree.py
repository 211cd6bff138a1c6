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
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{what} must be finite and >= 0")
    return arr


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _last_wins(keys: Int64Array) -> Int64Array:
    """Positions of the last occurrence of each distinct key."""
    # np.unique returns the first occurrence; on the reversed arrays that is the last one.
    _, first_in_reversed = np.unique(keys[::-1], return_index=True)
    return keys.shape[0] - 1 - first_in_reversed


class PriorityIndex:
    """Sum tree (plus max and min trees) over non-negative priorities, keyed by int64 keys.

    Heap layout: node 1 is the root, node i has children 2i and 2i+1, and the ``capacity``
    leaves (a power of two) are nodes ``capacity .. 2*capacity-1``; leaf ``capacity + s`` holds
    slot ``s``. Internal nodes are always recomputed from their children, never adjusted by a
    delta, so the tree cannot drift from the leaves however many updates it sees.

    ``payload`` names float columns stored beside each key (the replay index keeps created and
    expiry times there), given to ``upsert``/``build`` and read back by ``payload(name)``.
    """

    def __init__(self, capacity: int = 1024, *, payload: Sequence[str] = ()) -> None:
        self._payload_names = tuple(payload)
        self._slot_of: dict[int, int] = {}
        self._free: list[int] = []  # freed slots, reused before fresh ones
        self._next = 0  # slots [0, _next) have been handed out at least once
        self._allocate(_pow2_at_least(capacity))

    def _allocate(self, capacity: int) -> None:
        self._cap = capacity
        self._depth = capacity.bit_length() - 1
        self._sum = np.zeros(2 * capacity, dtype=np.float64)
        self._max = np.zeros(2 * capacity, dtype=np.float64)
        # Min over *positive* priorities (for the IS-weight normaliser): empty and zero -> inf.
        self._min = np.full(2 * capacity, np.inf, dtype=np.float64)
        self._keys = np.zeros(capacity, dtype=np.int64)
        self._live = np.zeros(capacity, dtype=bool)
        self._payload = {name: np.zeros(capacity) for name in self._payload_names}

    def _recompute_levels(self, first: int) -> None:
        """Recompute whole levels, from nodes ``[first, 2*first)`` up to the root, with slices."""
        trees = ((self._sum, np.add), (self._max, np.maximum), (self._min, np.minimum))
        lo = first
        while lo >= 1:
            for tree, combine in trees:
                combine(
                    tree[2 * lo : 4 * lo : 2], tree[2 * lo + 1 : 4 * lo : 2], out=tree[lo : 2 * lo]
                )
            lo //= 2

    def _rebuild_internal(self) -> None:
        self._recompute_levels(self._cap // 2)  # O(capacity), one slice step per level

    def _grow(self, needed_slots: int) -> None:
        old_cap, leaves = self._cap, slice(self._cap, 2 * self._cap)
        old_sum, old_max, old_min = self._sum[leaves], self._max[leaves], self._min[leaves]
        old_keys, old_live, old_payload = self._keys, self._live, self._payload
        new_cap = _pow2_at_least(needed_slots)  # at least doubles: amortized O(1) per insert
        self._allocate(new_cap)
        self._sum[new_cap : new_cap + old_cap] = old_sum
        self._max[new_cap : new_cap + old_cap] = old_max
        self._min[new_cap : new_cap + old_cap] = old_min
        self._keys[:old_cap] = old_keys
        self._live[:old_cap] = old_live
        for name, column in old_payload.items():
            self._payload[name][:old_cap] = column
        self._rebuild_internal()

    def _set_leaves(self, slots: Int64Array, values: Float64Array) -> None:
        """Write leaf values for distinct slots, then fix all ancestors, one numpy step a level."""
        idx = slots + self._cap
        self._sum[idx] = values
        self._max[idx] = values
        self._min[idx] = np.where(values > 0, values, np.inf)
        level = self._cap  # first node id of the level idx is on
        while level > 1 and level // 2 > idx.shape[0]:
            # All leaves are on one level, so after each shift the whole batch sits on the
            # same level and every child is already final. Duplicate parents just write the
            # same value twice, cheaper than deduplicating at every level. (Plain 1-D gathers:
            # fancy-indexing rows of a (n, 2) view measured several times slower.)
            idx = idx >> 1
            level //= 2
            left = idx << 1
            right = left + 1
            self._sum[idx] = self._sum[left] + self._sum[right]
            self._max[idx] = np.maximum(self._max[left], self._max[right])
            self._min[idx] = np.minimum(self._min[left], self._min[right])
        # Levels no wider than the batch: recomputing them whole takes 3 numpy calls a level
        # instead of 12 gathers and scatters (about 25% off a 256-update at 10^6).
        self._recompute_levels(level // 2)

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
        k, p = k[last], p[last]
        # The one per-key Python step: a dict lookup (map avoids a generator frame per key).
        found = map(self._slot_of.get, k.tolist(), repeat(-1))
        slots = np.fromiter(found, dtype=np.int64, count=k.shape[0])
        new = np.flatnonzero(slots < 0)
        if new.size:
            slots[new] = self._take_slots(new.size)
            self._keys[slots[new]] = k[new]
            self._live[slots[new]] = True
            self._slot_of.update(zip(k[new].tolist(), slots[new].tolist(), strict=True))
        for name, column in columns.items():
            self._payload[name][slots] = column[last]
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
        pop = self._slot_of.pop
        maybe = (pop(key, None) for key in set(_as_keys(keys).tolist()))
        freed = [slot for slot in maybe if slot is not None]
        if not freed:
            return
        slots = np.asarray(freed, dtype=np.int64)
        self._live[slots] = False
        self._set_leaves(slots, np.zeros(slots.shape[0]))
        self._free.extend(freed)

    def build(self, keys: KeysLike, priorities: npt.ArrayLike, **payload: npt.ArrayLike) -> None:
        """Replace the whole content in O(N) (no per-level walk per key). Duplicates: last wins."""
        k = _as_keys(keys)
        p = _as_weights(priorities, k.shape[0], "priorities")
        columns = self._as_payload(k.shape[0], payload)
        if k.shape[0]:
            last = _last_wins(k)
            k, p = k[last], p[last]
            columns = {name: column[last] for name, column in columns.items()}
        n = k.shape[0]
        self._allocate(_pow2_at_least(max(n, self._cap)))
        self._sum[self._cap : self._cap + n] = p
        self._max[self._cap : self._cap + n] = p
        self._min[self._cap : self._cap + n] = np.where(p > 0, p, np.inf)
        self._keys[:n] = k
        self._live[:n] = True
        for name, column in columns.items():
            self._payload[name][:n] = column
        self._rebuild_internal()
        self._slot_of = dict(zip(k.tolist(), range(n), strict=True))
        self._free = []
        self._next = n

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, key: object) -> bool:
        return key in self._slot_of

    @property
    def capacity(self) -> int:
        """Current number of leaves (grows by doubling)."""
        return self._cap

    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._sum[1])

    def max_priority(self) -> float:
        """Largest priority (0.0 when empty); new items without a TD error get this. O(1)."""
        return float(self._max[1])

    def min_priority(self) -> float:
        """Smallest *positive* priority (0.0 when there is none). O(1)."""
        low = float(self._min[1])
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
        slots = np.fromiter((self._slot_of[key] for key in _as_keys(keys).tolist()), dtype=np.int64)
        return self._sum[slots + self._cap]

    def keys_array(self) -> Int64Array:
        """Live keys, in slot order."""
        return self.items()[0]

    def items(self) -> tuple[Int64Array, Float64Array]:
        """Live keys and their priorities, in slot order."""
        slots = self._live_slots()
        return self._keys[slots], self._sum[slots + self._cap]

    def payload(self, name: str) -> Float64Array:
        """A payload column of the live keys, in the order of ``items()``."""
        return self._payload[name][self._live_slots()]

    def _live_slots(self) -> Int64Array:
        return np.flatnonzero(self._live[: self._next])

    def _check_sampleable(self) -> float:
        if not self._slot_of:
            raise ValueError("cannot sample from an empty replay index")
        total = self.total()
        if not total > 0:
            raise ValueError("cannot sample: every priority in the replay index is 0")
        return total

    def _descend(self, u: Float64Array, *, careful: bool) -> Int64Array:
        """Map prefix-sum targets ``u`` to leaf node ids, one numpy step per level."""
        idx = np.ones(u.shape[0], dtype=np.int64)
        for _ in range(self._depth):
            left = 2 * idx
            left_sum = self._sum[left]
            right = u >= left_sum
            if careful:
                # Never step into a zero-sum subtree: rounding in u - left_sum can push u past
                # a right subtree holding nothing, or onto a left subtree holding nothing.
                right = (right & (self._sum[left + 1] > 0)) | (left_sum <= 0)
            u = np.where(right, u - left_sum, u)
            idx = left + right
        return idx

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
        idx = self._descend(u, careful=False)
        bad = np.flatnonzero(self._sum[idx] <= 0)
        if bad.size:  # float edge, rare: re-walk only those targets with the guarded rule
            idx[bad] = self._descend(u[bad], careful=True)
        return self._keys[idx - self._cap], self._sum[idx] / total

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

    For strategies whose weights change with time (recency) or are flat (uniform), where a
    tree would have to be rewritten on every request anyway. Zero-weight keys are never drawn.
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
