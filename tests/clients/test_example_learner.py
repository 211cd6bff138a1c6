"""examples/learner.py: its data, its model, and one run against the live service."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".." / "shared" / "data" / "tau_bench" / "gpt-4o-airline.json"

pytestmark = pytest.mark.live_server

spec = importlib.util.spec_from_file_location("tau_learner", ROOT / "examples" / "learner.py")
assert spec and spec.loader
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def test_the_tau_bench_file_becomes_200_experiences_split_by_task():
    experiences = example.tau_bench_experiences(DATA, agent_id="a")
    assert len(experiences) == 200
    assert sum(e["test_result"]["passed"] for e in experiences) == 84  # as NOTES.txt counts
    assert sum(len(e["tool_calls"]) for e in experiences) == 1164
    assert any(call.get("error") for e in experiences for call in e["tool_calls"])
    train, held = example.split(experiences)
    train_tasks = {e["metadata"]["task_id"] for e in train}
    held_tasks = {e["metadata"]["task_id"] for e in held}
    assert len(train) + len(held) == 200 and not train_tasks & held_tasks
    assert len(held_tasks) == 13  # tasks 0, 4, ..., 48


def test_the_model_fits_its_training_data():
    train, _ = example.split(example.tau_bench_experiences(DATA, agent_id="a"))
    x, rewards = example.matrix(train), np.array([e["reward"] for e in train])
    model = example.LinearValueModel()
    before = model.loss(x, rewards)
    rng = np.random.default_rng(0)
    for _ in range(300):
        batch = rng.integers(0, len(train), 32)
        td_errors = model.step(x[batch], rewards[batch], np.ones(32))
        assert td_errors.shape == (32,) and (td_errors >= 0).all()
    assert model.loss(x, rewards) < 0.5 * before


def test_the_example_trains_on_the_services_dream_cycles(server, client):
    agent = "tau-example"
    train, _ = example.split(example.tau_bench_experiences(DATA, agent_id=agent))
    client.experience_record_many(items=train)
    for seed in range(3):
        server.manage("dream", "--agent", agent, "--seed", str(seed))
    env = {
        **os.environ,
        "FERRUM_URL": server.base_url,
        "FERRUM_API_KEY": server.api_key,
        "PYTHONPATH": str(ROOT / "clients" / "python" / "src"),
    }
    done = subprocess.run(
        [sys.executable, "examples/learner.py", "--agent", agent, "--cycles", "5", "--wait", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert f"{len(train)} experiences for {agent} (0 new)" in done.stdout  # loaded before
    assert "3 cycles, 24 draws; lease lost: False" in done.stdout
    cycles = client.dream_cycles_list(agent_id=agent, status="completed").results
    assert len(cycles) == 3
    first = client.dream_cycle_get(cycle_id=min(c.id for c in cycles))
    # The model starts at zero, so the first cycle's TD errors are |0 - reward|.
    assert [item.td_error_after for item in first.items] == [
        abs(item.experience.reward) for item in first.items if item.experience
    ]
