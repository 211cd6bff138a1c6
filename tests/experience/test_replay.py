"""Replay sampling against the exact distributions of DESIGN.md "Replay semantics".

Each test draws with fixed seeds through the selector the API uses, and compares the draws
with the exact P(i) by chi-square (non-stratified draws are independent)."""

import time
from datetime import timedelta

import numpy as np
import pytest
from django.conf import settings
from django.utils import timezone

from experience import replay_index
from experience.models import Experience
from experience.replay_index import ALL_AGENTS, get_replay_index
from experience.selectors import replay_sample
from experience.services import (
    experience_create_many,
    experience_curate,
    experience_delete_many,
    experience_td_error_update,
    priority_from_td_error,
)
from tests.experience.factories import experience_json, store
from tests.stats import P_VALUE_FLOOR, chi_square_p, normalised

pytestmark = pytest.mark.django_db
DRAWS = 40_960


def draw(
    strategy: str = "prioritized", **params
) -> tuple[np.ndarray, dict[int, float], dict[int, float]]:
    """DRAWS keys, and the probability and IS weight the sampler reported for each key."""
    params = {"alpha": settings.REPLAY_ALPHA, "beta": 0.4, "half_life": 3600.0, **params}
    keys, probability, weight = [], {}, {}
    for seed in range(DRAWS // 4096):
        batch = replay_sample(strategy=strategy, batch_size=4096, seed=seed, **params)
        for item in batch.items:
            keys.append(item.experience.pk)
            probability[item.experience.pk] = item.probability
            weight[item.experience.pk] = item.weight
    return np.array(keys), probability, weight


def current_priorities() -> dict[int, float]:
    return dict(Experience.objects.values_list("id", "priority"))


def assert_follows(
    keys: np.ndarray, expected: dict[int, float], reported: dict[int, float]
) -> None:
    assert chi_square_p(keys, expected) > P_VALUE_FLOOR
    for key, p in reported.items():
        assert p == pytest.approx(expected[key], rel=1e-9)


def test_prioritized_follows_unequal_td_errors():
    for td in (0.05, 0.3, 1.0, 2.0, 4.0):
        store(td_error=td)
    expected = normalised(current_priorities())
    keys, probability, _ = draw()
    assert_follows(keys, expected, probability)
    # The check can fail: the same draws are far from a uniform distribution.
    assert chi_square_p(keys, normalised(dict.fromkeys(expected, 1.0))) < 1e-9


def test_new_items_join_at_max_priority_and_are_sampled_accordingly():
    for td in (0.1, 0.2, 3.0):
        store(td_error=td)
    newcomer = store()
    assert newcomer.priority == pytest.approx(priority_from_td_error(3.0))
    keys, probability, _ = draw()
    assert_follows(keys, normalised(current_priorities()), probability)


def test_td_error_updates_are_reflected_on_the_next_request():
    rows = [store(td_error=1.0) for _ in range(4)]
    draw()  # builds the index
    experience_td_error_update(
        updates=[(rows[0].experience_id, 6.0), (rows[1].experience_id, 0.01)]
    )
    expected = normalised(current_priorities())
    assert expected[rows[0].pk] > 0.5
    keys, probability, _ = draw()
    assert_follows(keys, expected, probability)


def test_admin_override_is_reflected_on_the_next_request():
    rows = [store(td_error=1.0) for _ in range(4)]
    draw()
    experience_curate(experience=rows[2], td_error=1.0, priority=10.0)
    experience_curate(experience=rows[3], td_error=None, priority=0.0)  # never sample this one
    keys, probability, _ = draw()
    expected = normalised(current_priorities())
    assert rows[3].pk not in set(keys.tolist())
    assert_follows(keys, expected, probability)


def test_alpha_other_than_configured_is_sampled_exactly():
    tds = [0.1, 0.5, 1.0, 3.0]
    for td in tds:
        store(td_error=td)
    alpha = 1.0
    expected = normalised(
        {
            pk: (abs(td or 0.0) + settings.REPLAY_EPSILON) ** alpha
            for pk, td in Experience.objects.values_list("id", "td_error")
        }
    )
    keys, probability, _ = draw(alpha=alpha)
    assert_follows(keys, expected, probability)


def test_importance_weights_match_the_formula():
    for td in (0.1, 0.5, 1.0, 3.0, 7.0):
        store(td_error=td)
    beta = 0.7
    expected = normalised(current_priorities())
    n, p_min = len(expected), min(expected.values())
    _, _probability, weight = draw(beta=beta)
    for key, w in weight.items():
        formula = (n * expected[key]) ** -beta / (n * p_min) ** -beta
        assert w == pytest.approx(formula, abs=1e-9, rel=1e-9)
    assert max(weight.values()) <= 1.0


def test_recency_halves_the_weight_every_half_life():
    now = timezone.now()
    half_life = 600.0
    ages = [0, 300, 600, 1200, 2400]
    for age in ages:
        experience_create_many(
            items=[{**experience_json(), "experience_id": f"age-{age}"}],
            now=now - timedelta(seconds=age),
        )
    pks = dict(Experience.objects.values_list("experience_id", "id"))
    expected = normalised({pks[f"age-{age}"]: 0.5 ** (age / half_life) for age in ages})
    keys, probability, _ = draw("recency", half_life=half_life)
    assert_follows(keys, expected, probability)


def _recency_tree(half_life: float):
    # The index's own state, read to know which path a draw took: the tree's draws must follow
    # the rows exactly as the O(N) draw's do, and only a draw from the tree shows that.
    return get_replay_index()._recency[ALL_AGENTS].get(half_life)


def _store_aged(name: str, age: float, now) -> None:
    experience_create_many(
        items=[{**experience_json(), "experience_id": name}], now=now - timedelta(seconds=age)
    )


def _expected_recency(half_life: float, now) -> dict[int, float]:
    rows = Experience.objects.values_list("id", "created_at")
    return normalised({pk: 0.5 ** ((now - at).total_seconds() / half_life) for pk, at in rows})


def test_recency_draws_from_its_tree_follow_inserts_deletes_and_td_updates():
    now = timezone.now()
    half_life = 600.0
    for age in (300, 600, 1200, 2400):
        _store_aged(f"age-{age}", age, now)
    replay_sample(
        strategy="recency", batch_size=8, half_life=half_life, alpha=1.0, beta=0.4, seed=0
    )
    assert _recency_tree(half_life) is None  # the first draw at a half-life weights every item
    draw("recency", half_life=half_life)
    assert _recency_tree(half_life) is not None

    _store_aged("newest", 0, now)
    _store_aged("middle", 900, now)
    experience_delete_many(queryset=Experience.objects.filter(experience_id="age-600"))
    experience_td_error_update(updates=[("age-1200", 5.0), ("newest", 0.0)])
    keys, probability, _ = draw("recency", half_life=half_life)
    assert _recency_tree(half_life) is not None
    assert_follows(keys, _expected_recency(half_life, now), probability)


def test_recency_tree_starts_again_from_a_new_reference(monkeypatch):
    """Weights are held relative to the newest item when the tree was built; an item far
    newer than that (REBASE_HALF_LIVES) rebuilds it before a weight could overflow."""
    monkeypatch.setattr(replay_index, "REBASE_HALF_LIVES", 2)
    now = timezone.now()
    half_life = 10.0
    for age in (30, 40, 50):
        _store_aged(f"age-{age}", age, now)
    draw("recency", half_life=half_life)
    first = _recency_tree(half_life)
    _store_aged("now", 0, now)  # 3 half-lives past the tree's reference
    get_replay_index().catch_up()
    assert _recency_tree(half_life) is None
    keys, probability, _ = draw("recency", half_life=half_life)
    assert _recency_tree(half_life) not in (None, first)
    assert_follows(keys, _expected_recency(half_life, now), probability)


def test_uniform_gives_every_item_the_same_chance():
    rows = [store(td_error=td) for td in (0.01, 1.0, 9.0, 0.5)]
    keys, probability, weight = draw("uniform")
    assert_follows(keys, normalised({r.pk: 1.0 for r in rows}), probability)
    assert set(weight.values()) == {1.0}


def test_agent_filter_samples_only_that_agent():
    a = [store(agent_id="a", td_error=td) for td in (0.5, 2.0)]
    store(agent_id="b", td_error=50.0)
    keys, probability, _ = draw(agent_id="a")
    expected = normalised({r.pk: r.priority for r in a})
    assert_follows(keys, expected, probability)


def test_stratified_draws_keep_the_distribution():
    rows = [store(td_error=td) for td in (0.2, 1.0, 5.0)]
    batch = replay_sample(
        strategy="prioritized",
        batch_size=3000,
        seed=3,
        alpha=settings.REPLAY_ALPHA,
        beta=0.4,
        half_life=1.0,
        stratified=True,
    )
    counts = np.bincount([item.experience.pk for item in batch.items], minlength=rows[-1].pk + 1)
    expected = normalised({r.pk: r.priority for r in rows})
    for row in rows:  # one draw per segment: each count is within one of its expectation
        assert abs(counts[row.pk] - 3000 * expected[row.pk]) <= 1


@pytest.mark.parametrize("strategy", ["prioritized", "recency"])  # recency: its own trees
def test_expired_items_are_never_sampled_and_the_purge_deletes_them(strategy):
    live = store(td_error=1.0)
    # Expires 3 seconds from now: sampled now, never once that moment has passed.
    expiring = {**experience_json(td_error=50.0, ttl_seconds=60), "experience_id": "soon"}
    experience_create_many(items=[expiring], now=timezone.now() - timedelta(seconds=57))
    expires_at = Experience.objects.get(experience_id="soon").expires_at
    assert expires_at is not None
    assert len(set(draw(strategy)[0].tolist())) == 2
    time.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.1)
    keys, _, _ = draw(strategy)
    assert set(keys.tolist()) == {live.pk}

    from experience.tasks import purge_expired_experiences

    assert purge_expired_experiences() == 1
    assert list(Experience.objects.values_list("id", flat=True)) == [live.pk]


def test_no_ttl_keeps_items_forever():
    row = store(ttl_seconds=0)
    assert row.expires_at is None
