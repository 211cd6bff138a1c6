"""A learner on dream cycles: claim a cycle, train on its draws as arrays, report TD errors.

    from ferrum_memory_client import Client
    from ferrum_memory_client.learner import Learner

    def train(batch):  # a DreamBatch: numpy arrays plus the experiences
        predictions = model.predict(batch.experiences)
        model.update(batch, weights=batch.weights)
        return predictions - batch.rewards  # one TD error per draw

    with Client() as ferrum:
        Learner(ferrum, agent_id="a1").run(train, max_cycles=100)

A cycle is leased to one learner at a time. When the lease runs out before the report, another
learner may have claimed the cycle again: the report then answers 409, and the learner stops
without reporting again, since the cycle's new holder will (`LearnerRun.lease_lost`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .client import Client
from .errors import ConflictError
from .models import ClaimedDreamCycle, DreamCompletion, Experience

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DreamBatch:
    """A claimed cycle's draws, position by position (a draw may repeat an experience)."""

    cycle: ClaimedDreamCycle
    experience_ids: npt.NDArray[np.str_]
    rewards: npt.NDArray[np.float64]
    passed: npt.NDArray[np.bool_]
    weights: npt.NDArray[np.float64]  # importance-sampling weights, max 1
    probabilities: npt.NDArray[np.float64]
    experiences: Sequence[Experience | None]  # None: deleted since the cycle was drawn

    @classmethod
    def of(cls, cycle: ClaimedDreamCycle) -> DreamBatch:
        items = sorted(cycle.items, key=lambda item: item.position)
        experiences = [item.experience for item in items]
        return cls(
            cycle=cycle,
            experience_ids=np.array([item.experience_id for item in items], dtype=np.str_),
            rewards=np.array([e.reward if e else np.nan for e in experiences], dtype=np.float64),
            passed=np.array([bool(e and e.passed) for e in experiences], dtype=np.bool_),
            weights=np.array([item.weight for item in items], dtype=np.float64),
            probabilities=np.array([item.probability for item in items], dtype=np.float64),
            experiences=experiences,
        )

    @property
    def lease_token(self) -> str:
        return self.cycle.lease_token

    def td_error_map(self, td_errors: npt.ArrayLike) -> dict[str, float]:
        """{experience_id: td_error} from one TD error per draw; a repeated experience keeps its
        last draw's value (as the service does)."""
        values = np.asarray(td_errors, dtype=np.float64)
        if values.shape != self.experience_ids.shape:
            raise ValueError(f"{values.shape} TD errors for {self.experience_ids.shape} draws")
        if not np.isfinite(values).all():
            raise ValueError("TD errors must be finite")
        return dict(zip(self.experience_ids.tolist(), values.tolist(), strict=True))


@dataclass
class LearnerRun:
    cycles: int = 0  # cycles trained on and reported
    samples: int = 0  # draws in those cycles
    lease_lost: bool = False  # stopped because a report answered 409


class Learner:
    def __init__(
        self,
        client: Client,
        *,
        agent_id: str,
        name: str | None = None,
        lease_seconds: int | None = None,
    ) -> None:
        self.client, self.agent_id = client, agent_id
        self.name, self.lease_seconds = name, lease_seconds

    def claim(self) -> DreamBatch | None:
        """The agent's next cycle as a batch, or None when no cycle waits."""
        cycle = self.client.dream_cycle_claim(
            agent_id=self.agent_id, learner=self.name, lease_seconds=self.lease_seconds
        )
        return None if cycle is None else DreamBatch.of(cycle)

    def report(self, batch: DreamBatch, td_errors: npt.ArrayLike) -> DreamCompletion | None:
        """Report one TD error per draw with the batch's lease; None when the lease was lost
        (the cycle is another learner's now, or done), which is never reported twice."""
        try:
            return self.client.dream_cycle_report(
                cycle_id=batch.cycle.id,
                lease_token=batch.lease_token,
                td_errors=batch.td_error_map(td_errors),
            )
        except ConflictError as exc:
            logger.warning("dream cycle %s: lease lost, not reported: %s", batch.cycle.id, exc)
            return None

    def run(
        self,
        train: Callable[[DreamBatch], npt.ArrayLike],
        *,
        max_cycles: int | None = None,
        wait: float = 0.0,
        poll_interval: float = 1.0,
        stop: threading.Event | None = None,
    ) -> LearnerRun:
        """Claim, train and report until `max_cycles` are reported, no cycle came for `wait`
        seconds (0: stop at the first empty claim), `stop` is set, or a lease is lost."""
        run = LearnerRun()
        stop = stop or threading.Event()
        idle_since = time.monotonic()
        while not stop.is_set() and (max_cycles is None or run.cycles < max_cycles):
            batch = self.claim()
            if batch is None:
                if time.monotonic() - idle_since >= wait:
                    break
                stop.wait(poll_interval)
                continue
            if self.report(batch, train(batch)) is None:
                run.lease_lost = True
                break
            run.cycles += 1
            run.samples += len(batch.experience_ids)
            idle_since = time.monotonic()
        return run
