"""Per-agent replay controls: settings over the API, capacity with eviction, the sampling cap,
the samples-per-insert rate limiter, and exact sampling after evictions and retirements."""

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from experience.dream_services import dream_cycle_run, dream_cycles_run_due
from experience.models import DreamCycleItem, Experience, ReplaySettings, ReplayState
from experience.replay_index import get_replay_index
from experience.replay_selectors import replay_controls_get
from experience.replay_services import (
    replay_draw,
    replay_limiter_status,
    replay_settings_put,
)
from experience.selectors import experience_get
from experience.services import (
    experience_delete_many,
    experience_purge_expired,
    experience_td_error_update,
)
from ferrum_memory.core.exceptions import ServiceError, TooManyRequests
from ferrum_memory.core.services import api_key_create
from tests.experience.dream_helpers import dream_settings, stock  # noqa: F401 - the fixture
from tests.stats import P_VALUE_FLOOR, chi_square_p, normalised

pytestmark = pytest.mark.django_db
AGENT = "learner"


def client_for(**key_options: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='k', **key_options)[1]}")
    return client


def controls(**values: Any) -> None:
    replay_settings_put(agent_id=AGENT, values=values)


def draw(batch_size: int = 8, **params: Any) -> list[int]:
    """One replay request's pks, as the API draws them."""
    batch = replay_draw(
        agent_id=params.pop("agent_id", AGENT),
        batch_size=batch_size,
        beta=0.4,
        half_life=3600.0,
        **{"strategy": "prioritized", **params},
    )
    return [item.experience.pk for item in batch.items]


def db_state(agent_id: str = AGENT) -> ReplayState:
    return ReplayState.objects.get(agent_id=agent_id)


# Settings --------------------------------------------------------------------------------------


def test_an_agent_without_settings_has_the_environment_defaults(api_client, settings):
    settings.REPLAY_MAX_SIZE = 500
    settings.REPLAY_SAMPLES_PER_INSERT = 4.0
    body = api_client.get("/experience/settings", {"agent_id": AGENT}).json()
    assert body["customized"] is False
    assert (body["max_size"], body["samples_per_insert"]) == (500, 4.0)
    assert body["remover"] == "fifo" and body["alpha"] == django_settings.REPLAY_ALPHA
    assert body["limiter"] == {
        "inserts": 0,
        "samples": 0,
        "size": 0,
        "ratio": None,
        "allowed": 0.0,
        "inserts_needed": 1,
    }


def test_put_sets_each_setting_given_and_the_default_for_the_rest(api_client):
    response = api_client.put(
        "/experience/settings",
        {"agent_id": AGENT, "max_size": 10, "remover": "lowest_priority", "alpha": 0.9},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["customized"] is True
    row = ReplaySettings.objects.get(agent_id=AGENT)
    assert (row.max_size, row.remover, row.alpha) == (10, "lowest_priority", 0.9)
    assert (row.max_times_sampled, row.samples_per_insert) == (0, 0.0)
    # PUT replaces: what the next PUT leaves out goes back to its default.
    api_client.put("/experience/settings", {"agent_id": AGENT, "min_size": 3}, format="json")
    row.refresh_from_db()
    assert (row.max_size, row.remover, row.min_size) == (0, "fifo", 3)
    assert api_client.get("/experience/settings", {"agent_id": AGENT}).json()["min_size"] == 3


@pytest.mark.parametrize(
    "change",
    [
        {"max_size": -1},
        {"remover": "random"},
        {"samples_per_insert": "2"},
        {"spi_tolerance": True},
        {"max_times_sampled": 1.5},
        {"alpha": 11},
        {"agent_id": ""},
    ],
)
def test_bad_settings_get_400_with_the_field(api_client, change):
    response = api_client.put("/experience/settings", {"agent_id": AGENT, **change}, format="json")
    assert response.status_code == 400
    assert set(change) <= set(response.json())
    assert not ReplaySettings.objects.exists()


def test_a_key_limited_to_the_agent_reads_but_does_not_write_its_settings():
    own = client_for(allowed_agent_ids=[AGENT])
    assert own.get("/experience/settings", {"agent_id": AGENT}).status_code == 200
    assert own.get("/experience/settings", {"agent_id": "other"}).status_code == 403
    put = own.put("/experience/settings", {"agent_id": AGENT, "max_size": 1}, format="json")
    assert put.status_code == 403
    assert not ReplaySettings.objects.exists()


def test_the_agents_alpha_is_its_replays_default(api_client):
    for td in (0.1, 1.0, 4.0):
        stock(AGENT, 1, td_error=td)
    controls(alpha=1.0)
    body = api_client.get("/experience/replay", {"agent_id": AGENT, "seed": 1}).json()
    assert body["alpha"] == 1.0
    expected = normalised(
        {
            pk: abs(td or 0.0) + django_settings.REPLAY_EPSILON
            for pk, td in Experience.objects.values_list("id", "td_error")
        }
    )
    by_id = dict(Experience.objects.values_list("experience_id", "id"))
    for item in body["items"]:
        assert item["probability"] == pytest.approx(expected[by_id[item["experience"]["id"]]])


# Capacity --------------------------------------------------------------------------------------


def test_fifo_removes_the_oldest_past_max_size_through_tombstones():
    controls(max_size=5)
    rows = stock(AGENT, 4)
    get_replay_index().catch_up()
    newer = stock(AGENT, 3)
    kept = {row.pk for row in rows[2:] + newer}
    assert set(Experience.objects.values_list("id", flat=True)) == kept
    get_replay_index().catch_up()
    assert set(get_replay_index().priorities(AGENT)) == kept  # the index followed the tombstones
    assert set(get_replay_index().priorities()) == kept
    state = db_state()
    assert (state.size, state.inserts, state.removals) == (5, 7, 2)


def test_lowest_priority_removes_the_least_likely():
    controls(max_size=3, remover="lowest_priority")
    rows = [stock(AGENT, 1, td_error=td)[0] for td in (2.0, 0.1, 5.0)]
    newcomer = stock(AGENT, 1, td_error=1.0)[0]
    assert set(Experience.objects.values_list("id", flat=True)) == {
        rows[0].pk,
        rows[2].pk,
        newcomer.pk,
    }


@pytest.mark.parametrize("remover", ["fifo", "lowest_priority"])
def test_a_list_larger_than_the_capacity_keeps_its_newest(remover):
    controls(max_size=4, remover=remover)
    stock(AGENT, 2)
    batch = stock(AGENT, 10, td_error=0.01)
    assert set(Experience.objects.values_list("id", flat=True)) == {r.pk for r in batch[-4:]}
    assert (db_state().size, db_state().removals) == (4, 8)


def test_capacity_is_per_agent_and_other_agents_are_untouched():
    controls(max_size=2)
    others = stock("other", 5)
    stock(AGENT, 4)
    assert Experience.objects.filter(agent_id="other").count() == len(others)
    assert Experience.objects.filter(agent_id=AGENT).count() == 2


def test_deletes_and_the_purge_count_down_the_size(settings):
    rows = stock(AGENT, 5)
    experience_delete_many(queryset=Experience.objects.filter(pk=rows[0].pk))
    assert db_state().size == 4
    controls(max_size=5)
    stock(AGENT, 1)  # back at the capacity, not past it: nothing removed
    assert (db_state().size, db_state().removals) == (5, 0)
    stock(AGENT, 1)
    assert (db_state().size, db_state().removals) == (5, 1)


@pytest.mark.usefixtures("dream_settings")
def test_dream_history_keeps_the_draws_of_evicted_items():
    rows = stock(AGENT, 6)
    cycle = dream_cycle_run(agent_id=AGENT, seed=3)
    drawn = set(cycle.items.values_list("experience_pk", flat=True))
    controls(max_size=2)
    stock(AGENT, 2)
    assert not Experience.objects.filter(pk__in=[r.pk for r in rows]).exists()
    assert set(DreamCycleItem.objects.filter(cycle=cycle).values_list("experience_pk", flat=True))
    assert set(cycle.items.values_list("experience_pk", flat=True)) == drawn


# The sampling cap ------------------------------------------------------------------------------


def test_an_item_drawn_max_times_sampled_times_is_retired_and_never_drawn_again(api_client):
    controls(max_times_sampled=3)
    rows = stock(AGENT, 4)
    drawn: Counter[int] = Counter()
    for _ in range(10):
        try:
            drawn.update(draw(batch_size=2))
        except ServiceError:  # 409: every item is retired
            break
    assert drawn == {row.pk: 3 for row in rows}  # exactly the cap, each
    assert set(Experience.objects.values_list("times_sampled", flat=True)) == {3}
    assert Experience.objects.filter(retired_at__isnull=False).count() == 4
    assert db_state().retired == 4
    # Retired items stay in the DB, marked, and the API shows them so; the purge deletes them.
    shown = api_client.get(f"/experience/{rows[0].experience_id}").json()
    assert shown["retired_at"] is not None
    assert api_client.get("/experience/replay", {"agent_id": AGENT}).status_code == 409
    assert experience_purge_expired() == 4
    assert not Experience.objects.exists() and db_state().size == 0


def test_a_batch_stops_short_when_the_cap_retires_every_item():
    controls(max_times_sampled=1)
    rows = stock(AGENT, 3)
    pks = draw(batch_size=8)
    assert sorted(pks) == sorted(r.pk for r in rows)  # without replacement, then exhausted


def test_lowering_the_cap_retires_items_already_over_it_undrawn():
    rows = stock(AGENT, 2)
    Experience.objects.filter(pk=rows[0].pk).update(times_sampled=5)
    controls(max_times_sampled=2)
    pks = draw(batch_size=4)
    assert pks == [rows[1].pk, rows[1].pk]  # its cap; the other is retired without a draw
    assert experience_get(experience_id=rows[0].experience_id).retired_at is not None


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_never_draw_an_item_past_its_cap():
    """Replays in four threads, each with its own connection, against one capped agent: the
    counts are made in the draw's transaction, so together they draw each item exactly
    max_times_sampled times, however the requests interleave, and times_sampled agrees."""
    cap = 4
    controls(max_times_sampled=cap)
    rows = stock(AGENT, 30)
    draws: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def replay(seed: int) -> None:
        try:
            for attempt in range(200):
                try:
                    pks = draw(batch_size=3, seed=seed * 1000 + attempt)
                except ServiceError:  # everything retired
                    return
                with lock:
                    draws.extend(pks)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=replay, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert Counter(draws) == {row.pk: cap for row in rows}
    assert dict(Experience.objects.values_list("id", "times_sampled")) == {
        row.pk: cap for row in rows
    }
    assert Experience.objects.filter(retired_at=None).count() == 0


# The rate limiter ------------------------------------------------------------------------------


def test_the_limiter_grants_draws_within_the_ratio_then_answers_429(api_client):
    controls(samples_per_insert=2.0, spi_tolerance=4.0, min_size=2)
    stock(AGENT, 1)
    query = {"agent_id": AGENT, "batch_size": 4}
    refused = api_client.get("/experience/replay", query)  # below min_size
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["inserts_needed"] == 1
    stock(AGENT, 3)  # 4 inserts: (4 - 2) * 2 + 4 = 8 draws allowed
    assert api_client.get("/experience/replay", query).status_code == 200
    assert api_client.get("/experience/replay", query).status_code == 200
    refused = api_client.get("/experience/replay", query)
    assert refused.status_code == 429
    body = refused.json()
    assert (body["samples"], body["inserts"], body["ratio"]) == (8, 4, 2.0)
    assert body["inserts_needed"] == 2
    assert "8 samples for 4 inserts" in body["detail"]
    stock(AGENT, 2)
    assert api_client.get("/experience/replay", query).status_code == 200
    assert db_state().samples == 12


def test_a_draw_that_fails_gives_its_grant_back(api_client):
    controls(samples_per_insert=10.0)
    stock(AGENT, 2)
    response = api_client.get(
        "/experience/replay", {"agent_id": AGENT, "min_size": 5, "batch_size": 8}
    )
    assert response.status_code == 409
    assert db_state().samples == 0


@pytest.mark.django_db(transaction=True)
def test_wait_ms_waits_for_inserts_instead_of_answering_429():
    controls(samples_per_insert=1.0)
    stock(AGENT, 2)
    assert draw(batch_size=2)

    def insert_later() -> None:
        time.sleep(0.3)
        stock(AGENT, 2)
        connection.close()

    inserter = threading.Thread(target=insert_later)
    inserter.start()
    started = time.monotonic()
    pks = draw(batch_size=2, wait_ms=5000)
    waited = time.monotonic() - started
    inserter.join()
    assert len(pks) == 2 and waited >= 0.25
    with pytest.raises(TooManyRequests):  # nothing more arrives: the wait ends in a 429
        draw(batch_size=1, wait_ms=100)


@pytest.mark.usefixtures("dream_settings")
def test_a_dream_cycle_is_created_only_when_the_limiter_allows_it():
    controls(samples_per_insert=1.0)  # dream batches of 8
    stock(AGENT, 12)
    run = dream_cycles_run_due()
    assert [c.agent_id for c in run.cycles] == [AGENT]
    run = dream_cycles_run_due()
    assert not run.cycles and "rate limiter" in run.skipped[AGENT]
    assert db_state().samples == 8
    stock(AGENT, 4)
    assert len(dream_cycles_run_due().cycles) == 1


def test_a_replay_over_every_agent_is_refused_while_controls_are_set(api_client):
    stock(AGENT, 2)
    assert api_client.get("/experience/replay").status_code == 200
    controls(max_times_sampled=10)
    response = api_client.get("/experience/replay")
    assert response.status_code == 409 and "agent_id" in response.json()


def test_limiter_status_after_grants():
    controls(samples_per_insert=0.5, spi_tolerance=1.0)
    stock(AGENT, 6)
    draw(batch_size=4)
    status = replay_limiter_status(controls=replay_controls_get(agent_id=AGENT))
    assert (status.samples, status.inserts, status.allowed) == (4, 6, 0.0)
    assert status.ratio == pytest.approx(4 / 6)
    assert status.inserts_needed == 2  # (4 + 1 - 1) / 0.5 = 8 inserts


# Exactness after evictions and retirements -----------------------------------------------------


def draws(strategy: str, rounds: int = 10, **params: Any) -> tuple[np.ndarray, dict, dict]:
    keys, probability, weight = [], {}, {}
    for seed in range(rounds):
        batch = replay_draw(
            agent_id=AGENT,
            strategy=strategy,
            batch_size=4096,
            beta=0.6,
            half_life=600.0,
            seed=seed,
            **params,
        )
        for item in batch.items:
            keys.append(item.experience.pk)
            probability[item.experience.pk] = item.probability
            weight[item.experience.pk] = item.weight
    return np.array(keys), probability, weight


@pytest.mark.parametrize("strategy", ["prioritized", "uniform", "recency"])
def test_each_strategy_is_exact_over_the_buffer_left_by_evictions_and_retirements(strategy):
    controls(max_size=6, max_times_sampled=1)
    tds = [0.05, 0.3, 1.0, 2.0, 4.0, 0.7, 3.0, 0.2, 1.5]
    for td in tds:  # one at a time: each insert past 6 evicts the oldest
        stock(AGENT, 1, td_error=td)
    assert db_state().removals == 3
    retired = draw(batch_size=1, seed=5)  # one draw retires its item (cap 1)
    controls(max_size=6)  # no cap now, so the chi-square may draw with replacement
    left = Experience.objects.filter(retired_at=None)
    assert left.count() == 5 and retired[0] not in set(left.values_list("id", flat=True))
    if strategy == "prioritized":
        weights = dict(left.values_list("id", "priority"))
    elif strategy == "uniform":
        weights = dict.fromkeys(left.values_list("id", flat=True), 1.0)
    else:
        newest = max(left.values_list("created_at", flat=True))
        weights = {
            pk: 0.5 ** ((newest - created).total_seconds() / 600.0)
            for pk, created in left.values_list("id", "created_at")
        }
    expected = normalised(weights)
    keys, probability, weight = draws(strategy)
    assert chi_square_p(keys, expected) > P_VALUE_FLOOR
    n, p_min = len(expected), min(expected.values())
    for key, p in probability.items():
        assert p == pytest.approx(expected[key], rel=1e-6)
        # IS weights over the buffer as it is now: N = 5, not the 9 inserted or 6 kept.
        assert weight[key] == pytest.approx((n * p) ** -0.6 / (n * p_min) ** -0.6, rel=1e-6)


def test_capped_draws_report_the_probability_of_the_buffer_each_was_drawn_from():
    """With cap 1 a batch is successive sampling without replacement: the k-th draw's
    probability is its priority over what the earlier draws left."""
    controls(max_times_sampled=1)
    rows = [stock(AGENT, 1, td_error=td)[0] for td in (0.5, 1.0, 2.0, 4.0)]
    experience_td_error_update(updates=[(r.experience_id, r.td_error or 0) for r in rows])
    priority = dict(Experience.objects.values_list("id", "priority"))
    batch = replay_draw(
        agent_id=AGENT, strategy="prioritized", batch_size=4, beta=1.0, half_life=1.0, seed=11
    )
    left = dict(priority)
    for item in batch.items:
        total = sum(left.values())
        assert item.probability == pytest.approx(left[item.experience.pk] / total)
        p_min = min(left.values()) / total
        assert item.weight == pytest.approx(p_min / item.probability)  # beta 1: (p_min / p)
        del left[item.experience.pk]
    assert not left


@pytest.mark.parametrize("seed_count", [600])
def test_the_first_capped_draw_follows_the_priorities(seed_count):
    """The first draw of each capped batch is an ordinary PER draw: chi-square over seeds."""
    controls(max_times_sampled=1)
    for td in (0.1, 1.0, 3.0):
        stock(AGENT, 1, td_error=td)
    expected = normalised(dict(Experience.objects.values_list("id", "priority")))
    first = []
    index = get_replay_index()
    for seed in range(seed_count):
        first.append(draw(batch_size=1, seed=seed)[0])
        Experience.objects.update(retired_at=None, times_sampled=0)  # back, for the next seed
        index.invalidate()
    assert chi_square_p(np.array(first), expected) > P_VALUE_FLOOR


# The limiter across processes ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_sampler_processes_share_one_limiter(tmp_path):
    """Two processes sample one agent as fast as the limiter lets them while this one inserts:
    every grant, as each sampler saw the counters right after it, stays within
    (inserts - min_size) * samples_per_insert + tolerance; together they drew exactly what the
    shared counter says, and they used the allowance (neither starved nor overdrew)."""
    from tests.experience.test_dream_e2e import ROOT, process_env

    spi, tolerance, min_size, batch = 2.0, 6.0, 4, 3
    controls(samples_per_insert=spi, spi_tolerance=tolerance, min_size=min_size)
    env = {**process_env(tmp_path), "DJANGO_SETTINGS_MODULE": "ferrum_memory.settings.base"}
    stop = tmp_path / "stop"
    outs = [tmp_path / f"sampler-{n}.jsonl" for n in range(2)]
    samplers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.experience.limiter_sampler",
                AGENT,
                str(batch),
                str(out),
                str(stop),
            ],
            cwd=ROOT,
            env=env,
        )
        for out in outs
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(out.exists() and out.read_text() for out in outs):
            assert time.monotonic() < deadline, "the samplers did not start"
            assert all(s.poll() is None for s in samplers), "a sampler died"
            time.sleep(0.1)
        for _ in range(40):
            stock(AGENT, 1)
            time.sleep(0.03)
        time.sleep(1.0)  # the samplers take what the last inserts allow
    finally:
        stop.touch()
        for sampler in samplers:
            sampler.wait(timeout=30)
    lines = [[json.loads(line) for line in out.read_text().splitlines()] for out in outs]
    grants = [[line for line in mine if "drawn" in line] for mine in lines]
    refused = sum(mine[-1]["refused"] for mine in lines)
    state = db_state()
    ceiling = (state.inserts - min_size) * spi + tolerance
    print(
        f"\ntwo samplers: {[len(g) for g in grants]} batches granted of {batch}, "
        f"{refused} requests refused; {state.samples} samples for {state.inserts} inserts, "
        f"ceiling {ceiling:g}"
    )
    assert all(sampler.returncode == 0 for sampler in samplers)
    assert all(grants), "both processes were granted draws"
    for line in (line for mine in grants for line in mine):
        assert line["samples"] <= (line["inserts"] - min_size) * spi + tolerance, line
    assert sum(line["drawn"] for mine in grants for line in mine) == state.samples
    assert state.inserts == 40
    assert ceiling - batch < state.samples <= ceiling
    assert refused > 0


def test_a_tiny_ratio_needs_more_inserts_than_a_count_holds(api_client):
    response = api_client.put(
        "/experience/settings",
        {"agent_id": AGENT, "samples_per_insert": 5e-324, "min_size": 3},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["limiter"]["inserts_needed"] == 2**63 - 1


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REPLAY_REMOVER", "random"),
        ("REPLAY_MAX_SIZE", -1),
        ("REPLAY_SPI_TOLERANCE", -0.5),
        ("REPLAY_SNAPSHOT_SECONDS", 0),
    ],
)
def test_nonsense_replay_defaults_stop_the_start(settings, name, value):
    from django.core.exceptions import ImproperlyConfigured

    from experience.apps import check_replay_settings

    check_replay_settings()
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        check_replay_settings()


# The dashboard, the admin, the counters --------------------------------------------------------

DASHBOARD = "/admin/experience/dreamcycle/dashboard/"


def test_the_dashboard_shows_each_agents_controls_and_its_ratio_over_time(admin_client):
    from experience.replay_services import replay_snapshot_take
    from experience.tasks import take_replay_snapshot
    from tests.experience.browser import census

    controls(max_size=4, samples_per_insert=1.0, spi_tolerance=2.0, max_times_sampled=2)
    stock("other", 3)
    stock(AGENT, 6)  # 2 evicted
    start = timezone.now()
    assert replay_snapshot_take(now=start - timedelta(minutes=10)) == 2
    draw(batch_size=4)
    assert take_replay_snapshot() == 2
    page = admin_client.get(DASHBOARD + f"?agent_id={AGENT}").content.decode()
    marks = census(page).marks
    assert marks["spi-ratio-over-time"]["point"] == 2
    assert marks["size-over-time"]["point"] == 2
    assert "4 samples / 6 inserts" in page and "0 samples / 6 inserts" in page
    assert 'id="replay-controls"' in page and "100% full" in page
    row = page.split('id="replay-controls"')[1].split("</tr>")[1]
    cells = [c.split(">", 1)[1] for c in row.split("<td")[1:]]
    values = [c.split("</td>")[0].strip() for c in cells]
    # agent, size, capacity, removals, retired, inserts, samples, ratio, limiter, cap
    assert values[1:] == ["4", "4 (100% full)", "2", values[4], "6", "4", "0.667", "1.0", "2"]
    retired = Experience.objects.filter(agent_id=AGENT, retired_at__isnull=False).count()
    assert values[4] == str(retired)
    everyone = admin_client.get(DASHBOARD).content.decode()
    assert "other" in everyone.split('id="replay-controls"')[1]
    assert "4 samples / 9 inserts" in everyone  # every agent's counters, summed per moment


def test_admin_edits_settings_through_the_service_from_the_defaults(admin_client, settings):
    settings.REPLAY_MAX_SIZE = 77
    add = "/admin/experience/replaysettings/add/"
    assert 'value="77"' in admin_client.get(add).content.decode()
    form = {
        "agent_id": AGENT,
        "max_size": 3,
        "remover": "lowest_priority",
        "max_times_sampled": 0,
        "min_size": 0,
        "samples_per_insert": 0,
        "spi_tolerance": 0,
        "alpha": 0.6,
    }
    assert admin_client.post(add, form).status_code == 302
    assert replay_controls_get(agent_id=AGENT).max_size == 3
    bad = admin_client.post(add, {**form, "agent_id": "x", "samples_per_insert": -1})
    assert bad.status_code == 200 and not ReplaySettings.objects.filter(agent_id="x").exists()
    change = f"/admin/experience/replaysettings/{AGENT}/change/"
    assert admin_client.post(change, {**form, "max_size": 9}).status_code == 302
    assert replay_controls_get(agent_id=AGENT).max_size == 9
    assert admin_client.get("/admin/experience/replaystate/").status_code == 200


def test_recount_sets_sizes_from_the_rows_and_the_admin_runs_it(admin_client):
    from experience.replay_services import replay_state_recount

    stock(AGENT, 3)
    ReplayState.objects.filter(agent_id=AGENT).update(size=99)
    # A row loaded around the service (as the bench's COPY loads them): no counters follow.
    Experience.objects.create(
        experience_id="loaded",
        agent_id="loaded",
        task="t",
        reward=0.0,
        priority=1.0,
        created_at=timezone.now(),
        revision=0,
    )
    assert replay_state_recount() == 2
    assert db_state().size == 3
    assert (db_state("loaded").size, db_state("loaded").inserts) == (1, 1)
    ReplayState.objects.filter(agent_id=AGENT).update(size=50)
    response = admin_client.post(
        "/admin/experience/replaystate/",
        {"action": "recount", "_selected_action": [AGENT]},
    )
    assert response.status_code == 302 and db_state().size == 3


def test_experience_admin_filters_retired_items(admin_client):
    controls(max_times_sampled=1)
    rows = stock(AGENT, 2)
    draw(batch_size=1, seed=1)
    page = admin_client.get("/admin/experience/experience/?retired=yes").content.decode()
    retired = Experience.objects.get(retired_at__isnull=False)
    other = next(r for r in rows if r.pk != retired.pk)
    assert retired.experience_id in page and other.experience_id not in page
    page = admin_client.get("/admin/experience/experience/?retired=no").content.decode()
    assert other.experience_id in page


def test_erasing_the_agent_erases_its_replay_settings_counters_and_snapshots():
    from experience.models import ReplaySnapshot
    from experience.replay_services import replay_snapshot_take
    from experience.services import experience_erase_agent

    controls(max_size=10)
    stock(AGENT, 2)
    stock("other", 1)
    replay_snapshot_take()
    experience_erase_agent(agent_id=AGENT)
    for model in (ReplaySettings, ReplayState, ReplaySnapshot):
        assert not model.objects.filter(agent_id=AGENT).exists()
    assert ReplayState.objects.filter(agent_id="other").exists()


def test_a_capped_draw_takes_a_revision_only_when_it_retires_something():
    from ferrum_memory.core.revisions import revision_state

    controls(max_times_sampled=100)
    stock(AGENT, 3)
    before = revision_state(name="experience")[0]
    # Two draws of three items: at least one item is never drawn, so it is still sampleable
    # under the cap of 1 below (four draws could reach all three, leaving nothing to draw).
    draw(batch_size=2)
    assert revision_state(name="experience")[0] == before  # counted, nothing to catch up on
    controls(max_times_sampled=1)
    draw(batch_size=1)
    assert revision_state(name="experience")[0] == before + 1


@pytest.mark.usefixtures("dream_settings")
def test_a_dream_cycle_of_a_capped_and_limited_agent_counts_exactly():
    controls(max_times_sampled=2, samples_per_insert=4.0)
    rows = stock(AGENT, 4)
    cycle = dream_cycle_run(agent_id=AGENT, seed=2)  # 8 draws: each item exactly twice
    drawn = Counter(cycle.items.values_list("experience_pk", flat=True))
    assert drawn == {row.pk: 2 for row in rows}
    assert db_state().samples == 8 and db_state().retired == 4
