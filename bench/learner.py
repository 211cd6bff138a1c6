"""Learner benchmark: ``python bench/learner.py [--seeds 5] [--updates 100] [--batch 32]``.

One run, two tables, on the tau-bench airline trajectories (../shared/data/tau_bench) split by
task as examples/learner.py splits them (148 to train on, 52 held out), with the example's
linear value model:

- ``loss``: held-out MSE after the same number of updates, one update per dream cycle,
  prioritized (alpha 0.6, beta annealed from 0.4 to 1 over the run, IS-weighted updates)
  against uniform cycles, for each seed. Every cycle goes the way a deployed learner's goes:
  recorded in the service's database as beat records it (``dream_cycle_run``, called in this
  process on the server's SQLite file, with the strategy set per agent), claimed over HTTP with
  the SDK, trained on, and its TD errors |prediction - reward| reported over HTTP, which sets
  the priorities of the next cycles.
- ``throughput``: draws per second a learner gets through the service (claim a recorded cycle
  with its experiences, report its TD errors; and GET /experience/replay), against cpprb's
  ``PrioritizedReplayBuffer`` in-process on the same experiences' feature vectors and rewards
  (sample a batch, update its priorities). Beat's own cost to record a cycle is shown beside.

The service runs with gunicorn on the embedded defaults in a temporary folder (as the
schemathesis test starts it). Figures are for this machine under its load at the time; the
load average is printed with them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "clients" / "python" / "src"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from ferrum_memory_client import Client  # noqa: E402
from ferrum_memory_client.learner import Learner  # noqa: E402

from tests.api.live_server import LiveServer, live_server  # noqa: E402

_spec = importlib.util.spec_from_file_location("tau_learner", ROOT / "examples" / "learner.py")
assert _spec and _spec.loader
example: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

DATA = ROOT / ".." / "shared" / "data" / "tau_bench" / "gpt-4o-airline.json"
STRATEGIES = ("prioritized", "uniform")
ALPHA, BETA0, EPS = 0.6, 0.4, 1e-6


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _django(data_dir: Path, extra_env: dict[str, str]) -> None:
    """This process on the server's database, to record cycles as beat does."""
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "QDRANT_URL"):
        os.environ.pop(name, None)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="ferrum_memory.settings.base",
        FERRUM_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
        **extra_env,
    )
    import django

    django.setup()


def _record_cycle(agent_id: str, strategy: str, seed: int) -> None:
    from django.test import override_settings

    from experience.dream_services import dream_cycle_run

    # One process records cycles, one at a time: beat's run lock is not needed here.
    with override_settings(DREAM_STRATEGY=strategy):
        dream_cycle_run(agent_id=agent_id, seed=seed)


def _upload(client: Client, train: list[dict[str, Any]], agent_id: str) -> None:
    client.experience_record_many(
        items=[{**e, "id": f"{agent_id}:{e['id']}", "agent_id": agent_id} for e in train]
    )


def loss_table(client: Client, train, held_out, *, seeds: int, updates: int, lr: float) -> None:
    x_held, r_held = example.matrix(held_out), np.array([e["reward"] for e in held_out])
    x_train, r_train = example.matrix(train), np.array([e["reward"] for e in train])
    print(f"\n## MSE after {updates} updates, one per dream cycle  [{load()}]\n")
    print(f"Untrained (predicts 0): held-out {np.mean(r_held**2):.4f}. The training set's ", end="")
    print(f"mean reward as the prediction: held-out {np.mean((r_held - r_train.mean()) ** 2):.4f}.")
    print("\n| seed | held-out MSE: prioritized | uniform | difference ", end="")
    print("| training-set MSE: prioritized | uniform |")
    print("|---:|---:|---:|---:|---:|---:|")
    held: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    fit: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for seed in range(seeds):
        for strategy in STRATEGIES:
            agent = f"bench-{strategy}-{seed}"
            _upload(client, train, agent)
            model = example.LinearValueModel(learning_rate=lr)
            train_step = example.trainer(model)
            learner = Learner(client, agent_id=agent)
            for update in range(updates):
                _record_cycle(agent, strategy, seed * 1_000_003 + update)
                batch = learner.claim()
                assert batch is not None
                assert learner.report(batch, train_step(batch)) is not None
            held[strategy].append(model.loss(x_held, r_held))
            fit[strategy].append(model.loss(x_train, r_train))
        p, u = held["prioritized"][-1], held["uniform"][-1]
        tp, tu = fit["prioritized"][-1], fit["uniform"][-1]
        print(f"| {seed} | {p:.4f} | {u:.4f} | {p - u:+.4f} | {tp:.4f} | {tu:.4f} |")
    diffs = np.subtract(held["prioritized"], held["uniform"])
    sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
    mean = {s: (statistics.fmean(held[s]), statistics.fmean(fit[s])) for s in STRATEGIES}
    print(
        f"| mean | {mean['prioritized'][0]:.4f} | {mean['uniform'][0]:.4f} | "
        f"{diffs.mean():+.4f} (sd {sd:.4f}) | {mean['prioritized'][1]:.4f} | "
        f"{mean['uniform'][1]:.4f} |"
    )


def throughput_table(client: Client, train, *, batch: int, cycles: int) -> None:
    from cpprb import PrioritizedReplayBuffer

    agent = "bench-throughput"
    _upload(client, train, agent)
    started = time.perf_counter()
    for n in range(cycles):
        _record_cycle(agent, "prioritized", n)
    record_s = (time.perf_counter() - started) / cycles
    rng = np.random.default_rng(0)
    learner = Learner(client, agent_id=agent)
    started = time.perf_counter()
    draws = 0
    while (claimed := learner.claim()) is not None:
        learner.report(claimed, rng.random(len(claimed.experience_ids)))
        draws += len(claimed.experience_ids)
    learner_rate = draws / (time.perf_counter() - started)
    started = time.perf_counter()
    for n in range(cycles):
        client.replay_sample(agent_id=agent, batch_size=batch, seed=n)
    replay_rate = cycles * batch / (time.perf_counter() - started)

    x = example.matrix(train)
    rewards = np.array([e["reward"] for e in train])
    buffer = PrioritizedReplayBuffer(
        len(train), {"x": {"shape": x.shape[1]}, "r": {}}, alpha=ALPHA, eps=EPS
    )
    buffer.add(x=x, r=rewards)
    repeats = cycles * 20
    started = time.perf_counter()
    for _ in range(repeats):
        sample = buffer.sample(batch, beta=BETA0)
        buffer.update_priorities(sample["indexes"], rng.random(batch) + EPS)
    cpprb_rate = repeats * batch / (time.perf_counter() - started)

    print(f"\n## Draws per second, batch {batch}, {len(train)} experiences  [{load()}]\n")
    print("| path | draws/s | per batch |")
    print("|---|---:|---:|")
    for name, rate in [
        ("service: claim a dream cycle + report its TD errors (SDK, HTTP)", learner_rate),
        ("service: GET /experience/replay (SDK, HTTP)", replay_rate),
        ("cpprb PrioritizedReplayBuffer in-process: sample + update priorities", cpprb_rate),
    ]:
        print(f"| {name} | {rate:,.0f} | {batch / rate * 1e3:.3f} ms |")
    print(f"\nRecording one cycle (beat's work, in-process on the DB): {record_s * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--throughput-cycles", type=int, default=100)
    args = parser.parse_args()

    experiences = example.tau_bench_experiences(DATA, agent_id="bench")
    train, held_out = example.split(experiences)
    dream_env = {
        "DREAM_MIN_EXPERIENCES": "1",
        "DREAM_BATCH_SIZE": str(args.batch),
        "DREAM_MAX_PENDING": "0",
        "DREAM_BETA0": str(BETA0),
        "DREAM_BETA_ANNEAL_CYCLES": str(args.updates),
    }
    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder)
        with live_server(data_dir, API_THROTTLE_RATE="100000000/min", **dream_env) as server:
            _django(data_dir, dream_env)
            run(server, train, held_out, args)


def run(server: LiveServer, train, held_out, args: argparse.Namespace) -> None:
    print(f"# bench/learner.py: {len(train)} train / {len(held_out)} held-out experiences")
    with Client(server.api_key, server.base_url) as client:
        loss_table(
            client, train, held_out, seeds=args.seeds, updates=args.updates, lr=args.learning_rate
        )
        throughput_table(client, train, batch=args.batch, cycles=args.throughput_cycles)


if __name__ == "__main__":
    main()
