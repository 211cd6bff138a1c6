"""Statistical and model-based tests for the pure-numpy replay index (no Django needed)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from experience.sumtree import PriorityIndex, SlotMap, importance_weights, sample_weights
from tests.stats import P_VALUE_FLOOR, chi2_sf, chi_square_p, normalised


def draw(index: PriorityIndex, rng: np.random.Generator, n: int, **kw: bool) -> np.ndarray:
    return np.concatenate([index.sample(1000, rng, **kw)[0] for _ in range(n // 1000)])


def test_chi2_sf_matches_published_critical_values() -> None:
    # Critical values from the NIST/SEMATECH e-Handbook, table 1.3.6.7.4; the lower-tail ones
    # (sf 0.95) exercise the series branch, the upper-tail ones the continued fraction.
    assert chi2_sf(1.145, 5) == pytest.approx(0.95, abs=1e-4)
    assert chi2_sf(3.940, 10) == pytest.approx(0.95, abs=1e-4)
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(20.515, 5) == pytest.approx(0.001, abs=1e-5)
    assert chi2_sf(43.773, 30) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(124.342, 100) == pytest.approx(0.05, abs=1e-4)


def test_sample_follows_unequal_priorities() -> None:
    priorities = {11: 0.5, 12: 1.0, 13: 2.0, 14: 3.0, 15: 10.0, 16: 0.25}
    index = PriorityIndex()
    index.upsert(list(priorities), np.array(list(priorities.values())))
    rng = np.random.default_rng(1)

    keys, probs = index.sample(1000, rng)
    total = sum(priorities.values())
    np.testing.assert_allclose(probs, [priorities[k] / total for k in keys.tolist()], rtol=1e-12)

    draws = draw(index, rng, 100_000)
    assert chi_square_p(draws, normalised(priorities)) > P_VALUE_FLOOR
    # The same check must reject a wrong law, or it proves nothing.
    assert chi_square_p(draws, normalised(dict.fromkeys(priorities, 1.0))) < 1e-9


def test_sample_follows_priorities_after_updates() -> None:
    rng = np.random.default_rng(2)
    index = PriorityIndex()
    model = {k: float(p) for k, p in zip(range(100, 120), rng.uniform(0.1, 1.0, 20), strict=True)}
    index.upsert(list(model), np.array(list(model.values())))
    for _ in range(50):
        keys = rng.choice(list(model), size=5).tolist()
        new = rng.uniform(0.0, 5.0, size=5)
        index.upsert(keys, new)
        model.update(zip(keys, new.tolist(), strict=True))  # dict update: last wins, too
    model[105] = 0.0
    index.upsert([105], np.array([0.0]))
    draws = draw(index, rng, 100_000)
    assert 105 not in draws
    assert chi_square_p(draws, normalised(model)) > P_VALUE_FLOOR


def test_sample_follows_priorities_after_removals_and_slot_reuse() -> None:
    rng = np.random.default_rng(3)
    index = PriorityIndex(capacity=32)
    model = {k: float(k % 7 + 1) for k in range(32)}
    index.upsert(list(model), np.array(list(model.values())))
    removed = list(range(0, 32, 3))
    index.remove([*removed, 999])  # unknown key: ignored
    for k in removed:
        del model[k]
    fresh = {1000 + k: float(k + 1) for k in range(len(removed))}
    index.upsert(list(fresh), np.array(list(fresh.values())))
    model.update(fresh)

    assert index.capacity == 32, "freed slots must be reused before the tree grows"
    assert len(index) == len(model) == 32
    assert not any(k in index for k in removed)
    draws = draw(index, rng, 100_000)
    assert chi_square_p(draws, normalised(model)) > P_VALUE_FLOOR


def test_stratified_sampling_keeps_marginals_and_spreads_each_batch() -> None:
    rng = np.random.default_rng(4)
    priorities = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    index = PriorityIndex()
    index.upsert(list(priorities), np.array(list(priorities.values())))
    expected = normalised(priorities)

    # Stratified draws in one batch are dependent, so bound total variation instead of a
    # chi-square; multinomial noise at 100k draws is ~0.002, a biased sampler is far off.
    draws = draw(index, rng, 100_000, stratified=True)
    counts = Counter(draws.tolist())
    tv = 0.5 * sum(abs(counts[k] / len(draws) - p) for k, p in expected.items())
    assert tv < 0.005

    # Ten equal segments over priorities 1:2:3:4 hit each key exactly 1, 2, 3, 4 times: the
    # stratified path spreads a batch; the independent path does not, on the same seed.
    spread = {1: 1, 2: 2, 3: 3, 4: 4}
    batches = [index.sample(10, rng, stratified=True)[0] for _ in range(200)]
    assert all(Counter(b.tolist()) == spread for b in batches)
    plain = [index.sample(10, rng)[0] for _ in range(200)]
    assert any(Counter(b.tolist()) != spread for b in plain)


class _EdgeRng:
    """Stands in for a Generator whose uniforms sit on an end of [0, 1) (1.0 itself models the
    rounding of u * total up to total): the float edges a plain descent or search walks into
    an empty or zero-priority slot on."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self, size: int) -> np.ndarray:
        return np.full(size, self.value)


@pytest.mark.parametrize("stratified", [False, True])
def test_float_edge_never_returns_zero_priority_or_empty_slot(stratified: bool) -> None:
    for edge in (0.0, 1.0):
        rng_edge: Any = _EdgeRng(edge)
        index = PriorityIndex(capacity=8)
        index.upsert([1, 2, 3, 4], np.array([0.0, 1.0, 1.0, 0.0]))  # slots 4..7 empty
        keys, probs = index.sample(4, rng_edge, stratified=stratified)
        assert set(keys.tolist()) <= {2, 3}
        assert np.all(probs == 0.5)
        keys, probs = sample_weights(4, rng_edge, [1, 2, 3, 4], np.array([0.0, 1.0, 1.0, 0.0]))
        assert set(keys.tolist()) <= {2, 3}
        assert np.all(probs == 0.5)

    rng = np.random.default_rng(5)
    index = PriorityIndex()
    prios = rng.uniform(0.0, 1.0, 5000) * (rng.random(5000) < 0.3)  # mostly zeros
    index.upsert(np.arange(5000), prios)
    keys, probs = index.sample(20_000, rng, stratified=stratified)
    assert np.all(prios[keys] > 0) and np.all(probs > 0)


@pytest.mark.parametrize("exponent", [0.0, 0.5, 2.0])
def test_sample_powered_follows_powered_priorities(exponent: float) -> None:
    rng = np.random.default_rng(6)
    priorities = {k: float(k) for k in range(1, 11)} | {99: 0.0}
    index = PriorityIndex()
    index.upsert(list(priorities), np.array(list(priorities.values())))
    powered = {k: (p**exponent if p > 0 else 0.0) for k, p in priorities.items()}
    expected = normalised(powered)

    keys, probs = index.sample_powered(1000, rng, exponent)
    np.testing.assert_allclose(probs, [expected[k] for k in keys.tolist()], rtol=1e-12)
    assert index.min_probability(exponent) == pytest.approx(expected[1], rel=1e-12)

    draws = np.concatenate([index.sample_powered(1000, rng, exponent)[0] for _ in range(100)])
    assert chi_square_p(draws, expected) > P_VALUE_FLOOR
    assert chi_square_p(draws, normalised(priorities)) < 1e-9  # differs from the unpowered law


@pytest.mark.parametrize("removed", [30, 90])  # of 120: the drawn slots, or the live list
def test_sample_uniform_gives_every_live_key_the_same_chance(removed: int) -> None:
    rng = np.random.default_rng(8)
    index = PriorityIndex()
    keys = np.arange(1000, 1120)
    index.upsert(keys, rng.uniform(0.0, 9.0, keys.size))  # priorities play no part
    gone = rng.choice(keys, removed, replace=False)
    index.remove(gone)  # freed slots scattered among the live ones
    live = sorted(set(keys.tolist()) - set(gone.tolist()))

    draws, probs = index.sample_uniform(100_000, rng)
    assert set(draws.tolist()) == set(live)
    np.testing.assert_array_equal(probs, 1.0 / len(live))
    expected = normalised(dict.fromkeys(live, 1.0))
    assert chi_square_p(draws, expected) > P_VALUE_FLOOR
    # The same check rejects a law that favours the first half of the keys.
    skewed = normalised({k: 2.0 if i < len(live) // 2 else 1.0 for i, k in enumerate(live)})
    assert chi_square_p(draws, skewed) < 1e-9

    index.remove(live)
    with pytest.raises(ValueError, match="empty"):
        index.sample_uniform(1, rng)


def test_sample_weights_follows_weights_and_skips_zero_weights() -> None:
    rng = np.random.default_rng(7)
    keys = np.array([7, 8, 9, 10, 11])
    weights = np.array([0.0, 1.0, 0.5**3, 0.0, 4.0])  # zeros at an end and in the middle
    expected = normalised(dict(zip(keys.tolist(), weights.tolist(), strict=True)))

    draws, probs = sample_weights(100_000, rng, keys, weights)
    np.testing.assert_allclose(probs, [expected[k] for k in draws.tolist()], rtol=1e-12)
    assert chi_square_p(draws, expected) > P_VALUE_FLOOR

    with pytest.raises(ValueError):
        sample_weights(10, rng, keys, np.zeros(5))
    with pytest.raises(ValueError):
        sample_weights(10, rng, np.array([], dtype=np.int64), np.array([]))
    with pytest.raises(ValueError):
        sample_weights(10, rng, keys, np.array([1.0, -1.0, 1.0, 1.0, 1.0]))


def check_against_model(index: PriorityIndex, model: dict[int, float]) -> None:
    values = np.array(list(model.values()))
    assert len(index) == len(model)
    assert index.total() == pytest.approx(values.sum(), rel=1e-9, abs=1e-9)
    assert index.max_priority() == (values.max() if model else 0.0)
    positive = values[values > 0]
    assert index.min_priority() == (positive.min() if positive.size else 0.0)
    keys, prios = index.items()
    assert dict(zip(keys.tolist(), prios.tolist(), strict=True)) == model
    if model:
        np.testing.assert_array_equal(index.priorities(list(model)), values)


def test_tree_matches_naive_model_under_random_operations() -> None:
    rng = np.random.default_rng(8)
    index = PriorityIndex(capacity=4)
    model: dict[int, float] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.55:
            keys = rng.integers(0, 300, size=int(rng.integers(1, 40)))  # with duplicates
            prios = rng.exponential(1.0, size=keys.size) * (rng.random(keys.size) < 0.9)
            index.upsert(keys, prios)
            model.update(zip(keys.tolist(), prios.tolist(), strict=True))
        elif op < 0.95:
            keys = rng.integers(0, 350, size=int(rng.integers(1, 60)))
            index.remove(keys)
            for k in keys.tolist():
                model.pop(k, None)
        else:
            keys = rng.integers(0, 300, size=int(rng.integers(0, 200)))
            prios = rng.exponential(1.0, size=keys.size)
            index.build(keys, prios)
            model = dict(zip(keys.tolist(), prios.tolist(), strict=True))
        check_against_model(index, model)
        if step % 50 == 0 and index.total() > 0:
            drawn, _ = index.sample(500, rng)
            assert all(model[k] > 0 for k in drawn.tolist())


def test_upsert_duplicates_last_wins() -> None:
    index = PriorityIndex()
    index.upsert([5, 6, 5, 5], np.array([1.0, 2.0, 3.0, 4.0]))
    assert len(index) == 2
    np.testing.assert_array_equal(index.priorities([5, 6]), [4.0, 2.0])
    assert index.total() == 6.0


def test_importance_weights_match_formula() -> None:
    rng = np.random.default_rng(9)
    prios = rng.uniform(0.01, 3.0, 1000)
    index = PriorityIndex()
    index.upsert(np.arange(1000), prios)
    n, beta = len(index), 0.4
    min_p = index.min_probability()
    assert min_p == pytest.approx(prios.min() / prios.sum(), rel=1e-12)

    keys, probs = index.sample(256, rng)
    weights = importance_weights(probs, n, beta, min_p)
    p = prios[keys] / prios.sum()
    expected = (n * p) ** -beta / (n * min_p) ** -beta
    np.testing.assert_allclose(weights, expected, rtol=1e-9)
    assert np.all((weights > 0) & (weights <= 1.0))
    # The buffer-wide max weight, at the rarest item, is exactly 1.
    assert importance_weights(np.array([min_p]), n, beta, min_p)[0] == 1.0
    # beta = 0 turns the correction off.
    np.testing.assert_array_equal(importance_weights(probs, n, 0.0, min_p), np.ones(256))

    for bad in [(probs, 0, beta, min_p), (probs, n, beta, 0.0), (probs * 0, n, beta, min_p)]:
        with pytest.raises(ValueError):
            importance_weights(*bad)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -1e-12])
def test_invalid_priorities_are_rejected_and_nothing_is_written(bad: float) -> None:
    index = PriorityIndex()
    index.upsert([1, 2], np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        index.upsert([3, 1], np.array([1.0, bad]))
    with pytest.raises(ValueError):
        index.build([3, 1], np.array([1.0, bad]))
    check_against_model(index, {1: 1.0, 2: 2.0})


def test_malformed_input_is_rejected() -> None:
    index = PriorityIndex()
    with pytest.raises(ValueError):
        index.upsert([1, 2], np.array([1.0]))
    with pytest.raises(TypeError):
        index.upsert(np.array([1.5]), np.array([1.0]))
    with pytest.raises(KeyError):
        index.priorities([404])
    index.upsert([1], np.array([1.0]))
    with pytest.raises(ValueError):
        index.sample(0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        index.sample_powered(1, np.random.default_rng(0), -1.0)


def test_sampling_an_empty_or_all_zero_index_raises() -> None:
    rng = np.random.default_rng(10)
    index = PriorityIndex()
    assert index.total() == 0.0 and index.max_priority() == 0.0 and index.min_priority() == 0.0
    with pytest.raises(ValueError, match="empty"):
        index.sample(1, rng)
    with pytest.raises(ValueError, match="empty"):
        index.sample_powered(1, rng, 1.0)
    index.upsert([1, 2], np.zeros(2))
    with pytest.raises(ValueError, match="priority"):
        index.sample(1, rng, stratified=True)
    with pytest.raises(ValueError, match="priority"):
        index.sample_powered(1, rng, 0.5)
    index.upsert([2], np.array([1.0]))
    index.remove([1, 2])
    with pytest.raises(ValueError, match="empty"):
        index.sample(1, rng)


def test_growth_beyond_initial_capacity_keeps_every_priority() -> None:
    rng = np.random.default_rng(11)
    index = PriorityIndex(capacity=2)
    model: dict[int, float] = {}
    for start in range(0, 1000, 37):  # uneven batches cross every doubling
        keys = np.arange(start, min(start + 37, 1000)) * 10
        prios = rng.uniform(0.5, 2.0, keys.size)
        index.upsert(keys, prios)
        model.update(zip(keys.tolist(), prios.tolist(), strict=True))
        assert index.capacity >= len(index)
    assert index.capacity <= 1.25 * len(index)  # grown by a quarter at a time, not doubled
    check_against_model(index, model)
    skewed = {k: (50.0 if k < 50 else 1.0) for k in range(0, 100)}
    index.upsert(list(skewed), np.array(list(skewed.values())))  # keys 0..99: ten are new
    model.update(skewed)
    check_against_model(index, model)
    draws = draw(index, rng, 100_000)
    hot = {k for k, p in model.items() if p == 50.0}
    assert abs(np.isin(draws, list(hot)).mean() - 50 * len(hot) / sum(model.values())) < 0.01


def test_build_replaces_everything() -> None:
    rng = np.random.default_rng(12)
    index = PriorityIndex(capacity=4)
    index.upsert([1, 2, 3], np.array([1.0, 2.0, 3.0]))
    keys = rng.permutation(100_000) + 10**9
    prios = rng.exponential(1.0, keys.size)
    index.build(keys, prios)
    assert 1 not in index and int(keys[0]) in index
    # Not the next power of two (131,072): the next multiple of 256 the levels divide.
    assert index.capacity == 100_096
    check_against_model(index, dict(zip(keys.tolist(), prios.tolist(), strict=True)))
    index.upsert([5], np.array([2.0]))  # the rebuilt index keeps accepting writes
    assert len(index) == 100_001


def test_payload_columns_follow_their_keys_through_updates_removals_and_growth() -> None:
    index = PriorityIndex(capacity=2, payload=("created",))
    index.upsert([1, 2, 3], [1.0, 2.0, 3.0], created=[10.0, 20.0, 30.0])
    index.upsert([2, 2], [5.0, 6.0], created=[21.0, 22.0])  # last wins, payload too
    index.remove([1])
    index.upsert([4], [4.0], created=[40.0])  # reuses key 1's slot
    keys, priorities = index.items()
    by_key = dict(zip(keys.tolist(), index.payload("created").tolist(), strict=True))
    assert by_key == {2: 22.0, 3: 30.0, 4: 40.0}
    assert dict(zip(keys.tolist(), priorities.tolist(), strict=True)) == {2: 6.0, 3: 3.0, 4: 4.0}
    index.build([7, 8, 7], [1.0, 1.0, 2.0], created=[70.0, 80.0, 71.0])
    keys, _ = index.items()
    assert dict(zip(keys.tolist(), index.payload("created").tolist(), strict=True)) == {
        7: 71.0,
        8: 80.0,
    }


def test_payload_must_name_exactly_the_declared_columns() -> None:
    index = PriorityIndex(payload=("created",))
    with pytest.raises(ValueError, match="payload must be exactly"):
        index.upsert([1], [1.0])
    with pytest.raises(ValueError, match="other lengths"):
        index.upsert([1, 2], [1.0, 1.0], created=[1.0])


def test_keys_of_any_spread_map_like_a_dict() -> None:
    # Dense growing keys live in the slot map's table; keys far from them (negative, huge, a
    # lone old one) go to its dict. Every mix must behave as a plain dict would.
    rng = np.random.default_rng(13)
    index = PriorityIndex(capacity=4)
    model: dict[int, float] = {}
    far = np.array([-5, 10**12, 2**62, 7, -(2**62)])
    for step in range(300):
        dense = 1000 + step * 20 + rng.integers(0, 60, size=int(rng.integers(1, 30)))
        keys = np.concatenate([dense, rng.choice(far, size=int(rng.integers(0, 3)))])
        prios = rng.exponential(1.0, size=keys.size)
        index.upsert(keys, prios)
        model.update(zip(keys.tolist(), prios.tolist(), strict=True))
        gone = rng.choice(np.array(list(model)), size=min(len(model), int(rng.integers(0, 25))))
        index.remove(gone)
        for key in gone.tolist():
            model.pop(key, None)
        check_against_model(index, model)
    assert all((key in index) == (key in model) for key in [*far.tolist(), 2**70, "7", 1.5])
    with pytest.raises(KeyError):
        index.priorities([next(k for k in range(-1, -100, -1) if k not in model)])


def test_a_sliding_window_of_keys_keeps_the_slot_table_small() -> None:
    # A buffer at capacity (fifo): each batch of new, larger keys evicts the oldest ones.
    index = PriorityIndex()
    index.upsert(np.arange(10_000), np.ones(10_000))
    for start in range(10_000, 1_000_000, 10_000):
        index.remove(np.arange(start - 10_000, start))
        index.upsert(np.arange(start, start + 10_000), np.ones(10_000))
    slots = index._slot_of
    assert len(index) == 10_000 and not slots._extra
    assert slots._table.shape[0] <= 4 * 10_000  # not the 10^6 keys ever seen


def test_float_edge_below_the_flat_search_never_returns_a_zero_priority() -> None:
    # Over FLAT_SEARCH slots the walk starts at an internal level: u == total (rounding) must
    # still end on a positive leaf, the last one, at every level of the walk.
    index = PriorityIndex(capacity=1 << 16)
    prios = np.zeros(40_000)
    prios[[3, 17, 5000, 39_000]] = [1.0, 2.0, 3.0, 4.0]
    index.upsert(np.arange(40_000), prios)
    for edge in (0.0, 1.0):
        rng_edge: Any = _EdgeRng(edge)
        keys, probs = index.sample(8, rng_edge)
        assert set(keys.tolist()) == ({3} if edge == 0.0 else {39_000})
        assert np.all(probs > 0)


def test_a_far_key_joins_the_slot_table_once_the_live_keys_reach_it() -> None:
    index = PriorityIndex()
    index.upsert(np.arange(100), np.ones(100))
    index.upsert([10**6], [5.0])  # far from the rest: the slot map's dict holds it
    assert index._slot_of._extra == {10**6: 100}
    index.remove(np.arange(100))
    index.upsert(np.arange(10**6 - 50, 10**6), np.full(50, 2.0))  # the live keys move there
    assert not index._slot_of._extra
    check_against_model(index, {**dict.fromkeys(range(10**6 - 50, 10**6), 2.0), 10**6: 5.0})


def test_indexes_of_disjoint_keys_can_share_one_slot_map() -> None:
    # The replay index's per-agent trees: keys interleaved (one key, one agent), one map.
    rng = np.random.default_rng(14)
    shared = SlotMap()
    indexes = [PriorityIndex(capacity=4, slot_map=shared) for _ in range(3)]
    models: list[dict[int, float]] = [{}, {}, {}]
    for step in range(200):
        owner = int(rng.integers(0, 3))
        keys = rng.integers(0, 600, size=int(rng.integers(1, 30)))
        keys = keys[keys % 3 == owner]  # each key belongs to one index for good
        if step % 40 == 39:
            prios = rng.exponential(1.0, keys.size)
            indexes[owner].build(keys, prios)
            models[owner] = dict(zip(keys.tolist(), prios.tolist(), strict=True))
        elif rng.random() < 0.7:
            prios = rng.exponential(1.0, keys.size)
            indexes[owner].upsert(keys, prios)
            models[owner].update(zip(keys.tolist(), prios.tolist(), strict=True))
        else:
            indexes[owner].remove(keys)
            for key in keys.tolist():
                models[owner].pop(key, None)
        for index, model in zip(indexes, models, strict=True):
            check_against_model(index, model)
    assert len(shared) == sum(len(model) for model in models)
    key = next(iter(models[0]))
    assert key in indexes[0] and key not in indexes[1] and key not in indexes[2]
    with pytest.raises(KeyError):
        indexes[1].priorities([key])
