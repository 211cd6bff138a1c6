"""One sampler process of the two-process rate-limiter test (test_replay_limiter_processes).

``python -m tests.experience.limiter_sampler AGENT BATCH OUT STOP``: draws batches for AGENT
through the replay controls until the file STOP exists, and writes JSON lines to OUT: "ready"
once Django is set up, then one line per granted batch with the agent's counters read right
after it, and at the end how many requests the limiter refused."""

import json
import os
import sys
from pathlib import Path


def main(agent: str, batch_size: int, out: Path, stop: Path) -> None:
    import django

    django.setup()
    from experience.models import ReplayState
    from experience.replay_services import replay_draw
    from ferrum_memory.core.exceptions import TooManyRequests

    refused = 0
    with out.open("w") as lines:

        def write(**line: object) -> None:
            lines.write(json.dumps(line) + "\n")
            lines.flush()

        write(ready=os.getpid())
        while not stop.exists():
            try:
                batch = replay_draw(
                    agent_id=agent,
                    batch_size=batch_size,
                    strategy="uniform",
                    beta=0.4,
                    half_life=3600.0,
                    wait_ms=50,
                    count_now=True,
                )
            except TooManyRequests:
                refused += 1
                continue
            samples, inserts = ReplayState.objects.values_list("samples", "inserts").get(
                agent_id=agent
            )
            write(drawn=len(batch.items), samples=samples, inserts=inserts)
        write(refused=refused)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
