"""The learner loop on real dream cycles (recorded by `manage.py dream`, as beat would)."""

import time

import httpx
import numpy as np
import pytest
from ferrum_memory_client import Client
from ferrum_memory_client.learner import DreamBatch, Learner

from .conftest import FAST_RETRY

pytestmark = pytest.mark.live_server


def _load(client: Client, agent_id: str, n: int = 12) -> dict[str, float]:
    items = [
        {
            "agent_id": agent_id,
            "task": f"task {i}",
            "reward": i / n,
            "test_result": {"passed": i % 3 == 0},
        }
        for i in range(n)
    ]
    batch = client.experience_record_many(items=items)
    return {item.id: i / n for i, item in enumerate(batch.items)}


def _dream(server, agent_id: str, cycles: int = 1) -> None:
    for seed in range(cycles):
        server.manage("dream", "--agent", agent_id, "--seed", str(seed))


def test_a_claimed_cycle_comes_as_arrays_and_its_td_errors_go_back(client, server, agent_id):
    rewards = _load(client, agent_id)
    _dream(server, agent_id)
    learner = Learner(client, agent_id=agent_id, name="unit")
    batch = learner.claim()
    assert batch is not None
    detail = client.dream_cycle_get(cycle_id=batch.cycle.id)
    assert batch.experience_ids.tolist() == [item.experience_id for item in detail.items]
    assert batch.rewards.tolist() == [rewards[i] for i in batch.experience_ids]
    assert batch.probabilities.tolist() == [item.probability for item in detail.items]
    assert batch.weights.tolist() == [item.weight for item in detail.items]
    assert batch.weights.max() == 1.0
    assert batch.passed.tolist() == [bool(e and e.passed) for e in batch.experiences]
    assert batch.passed.any() and not batch.passed.all()
    assert batch.rewards.dtype == np.float64 and batch.passed.dtype == np.bool_

    with pytest.raises(ValueError, match="draws"):
        learner.report(batch, np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        learner.report(batch, np.full(len(batch.experience_ids), np.nan))
    td_errors = np.abs(0.5 - batch.rewards)
    done = learner.report(batch, td_errors)
    assert done is not None
    assert done.cycle.status == "completed"
    expected = batch.td_error_map(td_errors)
    for experience_id, td_error in expected.items():
        assert client.experience_get(experience_id=experience_id).td_error == td_error


def test_run_trains_on_every_waiting_cycle_then_stops(client, server, agent_id):
    _load(client, agent_id)
    _dream(server, agent_id, cycles=3)
    seen: list[int] = []

    def train(batch: DreamBatch) -> np.ndarray:
        seen.append(batch.cycle.id)
        return batch.rewards * 0.1

    run = Learner(client, agent_id=agent_id).run(train, wait=0.2, poll_interval=0.05)
    assert (run.cycles, run.samples, run.lease_lost) == (3, 24, False)
    assert len(set(seen)) == 3
    completed = client.dream_cycles_list(agent_id=agent_id, status="completed").results
    assert {c.id for c in completed} == set(seen)
    _dream(server, agent_id, cycles=2)
    assert Learner(client, agent_id=agent_id).run(train, max_cycles=1).cycles == 1


def test_a_lost_lease_stops_the_learner_without_a_second_report(server, agent_id):
    reports: list[str] = []

    def count(request: httpx.Request) -> None:
        if request.url.path.endswith("/td-errors"):
            reports.append(request.url.path)

    http = httpx.Client(event_hooks={"request": [count]})
    slow_client = Client(server.api_key, server.base_url, retry=FAST_RETRY, http_client=http)
    other_client = Client(server.api_key, server.base_url, retry=FAST_RETRY)
    _load(other_client, agent_id)
    _dream(server, agent_id)
    slow = Learner(slow_client, agent_id=agent_id, name="slow", lease_seconds=1)
    other = Learner(other_client, agent_id=agent_id, name="other")
    taken_over = []

    def train_too_slowly(batch: DreamBatch) -> np.ndarray:
        # The lease runs out while training, and another learner claims the cycle again.
        deadline = time.monotonic() + 60
        while (again := other.claim()) is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the only cycle is leased until the lease runs out
        assert again is not None and again.cycle.id == batch.cycle.id
        taken_over.append(again)
        return np.ones(len(batch.experience_ids))

    run = slow.run(train_too_slowly)
    assert run.lease_lost and run.cycles == 0
    assert len(reports) == 1  # tried once, not again
    [again] = taken_over
    assert again.cycle.claim_count == 2
    assert other.report(again, np.full(len(again.experience_ids), 0.5)) is not None
    cycle = other_client.dream_cycle_get(cycle_id=again.cycle.id)
    assert {item.td_error_after for item in cycle.items} == {0.5}  # the new holder's report
    for closable in (slow_client, other_client, http):
        closable.close()
