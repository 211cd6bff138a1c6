"""A learner on dream cycles: a linear value model of tau-bench tool-calling trajectories.

    FERRUM_URL=http://127.0.0.1:8000 FERRUM_API_KEY=fm_... python examples/learner.py

It loads the tau-bench airline trajectories (../shared/data/tau_bench) through the SDK, three
tasks in four held out, then trains on the dream cycles beat records for the agent: each claimed
cycle's draws go through a numpy linear model on hashed features of the task and its tool calls,
the model steps toward the rewards (weighted by the draws' importance-sampling weights), and
|prediction - reward| goes back as each draw's TD error, which becomes its priority for the next
cycles. It prints the held-out loss as it goes.

Beat records a cycle every DREAM_INTERVAL_SECONDS (300 by default; for a demo start the service
with `DREAM_INTERVAL_SECONDS=5 make run` on a fresh `var/`, or run
`python manage.py dream --agent tau-bench-airline` to record one now). Needs numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from ferrum_memory_client import Client
from ferrum_memory_client.learner import DreamBatch, Learner

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tau_bench"
DIMENSIONS = 2**10
WORD = re.compile(r"[a-z0-9_]+")


# tau-bench trajectories as experiences -------------------------------------------------------


def _tool_calls(trajectory: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The assistant's tool calls in order, each marked with the error its answer reported."""
    calls: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for message in trajectory:
        for call in message.get("tool_calls") or []:
            record = {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
            calls.append(record)
            by_id[call.get("id", "")] = record
        answer = message.get("content") or ""
        if message.get("role") == "tool" and answer.startswith("Error"):
            by_id.get(message.get("tool_call_id", ""), {})["error"] = answer[:500]
    return calls


def tau_bench_experiences(path: Path, *, agent_id: str) -> list[dict[str, Any]]:
    """One experience per trajectory; ids from the file, so loading twice stores once."""
    experiences = []
    for record in json.loads(path.read_text()):
        reward = float(record["reward"])
        experiences.append(
            {
                "id": f"tau-{path.stem}-{record['task_id']}-{record['trial']}",
                "agent_id": agent_id,
                "task": record["info"]["task"]["instruction"][:20_000],
                "tool_calls": _tool_calls(record["traj"]),
                "test_result": {"passed": reward >= 1.0, "total": 1},
                "reward": reward,
                "metadata": {"task_id": record["task_id"], "trial": record["trial"]},
            }
        )
    return experiences


def split(
    experiences: Sequence[dict[str, Any]], *, held_out_every: int = 4
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held out): every `held_out_every`-th task is held out with all its trials, so the
    held-out loss measures tasks the model never saw."""
    held = [e for e in experiences if e["metadata"]["task_id"] % held_out_every == 0]
    return [e for e in experiences if e["metadata"]["task_id"] % held_out_every != 0], held


# The value model -----------------------------------------------------------------------------


def _bucket(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=4).digest(), "big")


def features(task: str, tool_calls: Sequence[Mapping[str, Any]]) -> npt.NDArray[np.float64]:
    """Hashed bag of the task's words and the tools called (with their errors), plus a bias and
    the number of calls and of errors; unit length."""
    x = np.zeros(DIMENSIONS)
    for word in WORD.findall(task.lower()):
        x[_bucket(f"w:{word}") % DIMENSIONS] += 1.0
    for call in tool_calls:
        x[_bucket(f"t:{call['name']}") % DIMENSIONS] += 1.0
        if call.get("error"):
            x[_bucket(f"e:{call['name']}") % DIMENSIONS] += 1.0
    norm = np.linalg.norm(x)
    x = x / norm if norm else x
    x[0] = 1.0  # bias
    x[1] = len(tool_calls) / 20
    x[2] = sum(1 for call in tool_calls if call.get("error")) / 5
    return x


def matrix(experiences: Sequence[Mapping[str, Any]]) -> npt.NDArray[np.float64]:
    return np.stack([features(e["task"], e.get("tool_calls") or []) for e in experiences])


class LinearValueModel:
    """reward ~ w . x, trained by importance-weighted SGD on the squared error."""

    def __init__(self, *, learning_rate: float = 0.5) -> None:
        self.w = np.zeros(DIMENSIONS)
        self.learning_rate = learning_rate

    def predict(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return x @ self.w

    def loss(self, x: npt.NDArray[np.float64], rewards: npt.NDArray[np.float64]) -> float:
        return float(np.mean((self.predict(x) - rewards) ** 2))

    def step(
        self,
        x: npt.NDArray[np.float64],
        rewards: npt.NDArray[np.float64],
        weights: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """One update on a batch; the TD errors |prediction - reward| from before it."""
        errors = self.predict(x) - rewards
        self.w -= self.learning_rate * (weights * errors) @ x / len(rewards)
        return np.abs(errors)


def trainer(model: LinearValueModel) -> Callable[[DreamBatch], npt.NDArray[np.float64]]:
    """The learner loop's `train`: one update per dream cycle."""

    def train(batch: DreamBatch) -> npt.NDArray[np.float64]:
        drawn = [e.model_dump() if e else {"task": "", "tool_calls": []} for e in batch.experiences]
        rewards = np.nan_to_num(batch.rewards)  # an experience deleted since: reward 0
        return model.step(matrix(drawn), rewards, batch.weights)

    return train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA / "gpt-4o-airline.json")
    parser.add_argument("--agent", default="tau-bench-airline")
    parser.add_argument("--cycles", type=int, default=100, help="stop after this many")
    parser.add_argument("--wait", type=float, default=900, help="seconds to wait for a cycle")
    parser.add_argument("--learning-rate", type=float, default=0.5)
    args = parser.parse_args()

    train_set, held_out = split(tau_bench_experiences(args.data, agent_id=args.agent))
    x_held = matrix(held_out)
    r_held = np.array([e["reward"] for e in held_out])
    model = LinearValueModel(learning_rate=args.learning_rate)
    train = trainer(model)

    def train_and_report(batch: DreamBatch) -> npt.NDArray[np.float64]:
        td_errors = train(batch)
        cycle = batch.cycle
        print(
            f"cycle {cycle.number:>4} ({cycle.strategy}, beta {cycle.beta:.3f}): mean |TD error| "
            f"{td_errors.mean():.3f}, held-out MSE {model.loss(x_held, r_held):.4f}"
        )
        return td_errors

    with Client() as ferrum:
        loaded = ferrum.experience_record_many(items=train_set)
        print(
            f"{len(train_set)} experiences for {args.agent} ({loaded.created} new), "
            f"{len(held_out)} held out; held-out MSE {model.loss(x_held, r_held):.4f} untrained"
        )
        run = Learner(ferrum, agent_id=args.agent, name="examples/learner.py").run(
            train_and_report, max_cycles=args.cycles, wait=args.wait
        )
    print(f"{run.cycles} cycles, {run.samples} draws; lease lost: {run.lease_lost}")


if __name__ == "__main__":
    main()
