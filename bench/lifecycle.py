"""Agent lifecycle benchmark: ``python bench/lifecycle.py [--items 100000] [--others 10000]``.

Runs the service's own code on the embedded engines (SQLite, a qdrant-edge shard, the replay
sum trees) in a fresh temporary data folder:

1. loads one agent with ``--items`` memory items and as many experiences, and another agent
   with ``--others`` of each. Memory rows are written straight to the DB (real LoCoMo turns,
   random unit vectors as embeddings: embedding 10^5 texts would take most of an hour), as
   ``bench/search.py`` does; experiences go through ``experience_create_many``. The vector
   index and the replay trees are then built from the DB.
2. exports the big agent to a JSON Lines file (``agents.selectors.agent_export``): items/s.
3. erases it (``agents.services.agent_erase``) while a thread keeps serving the other agent,
   alternating a hybrid ``memory_search`` and a prioritized ``replay_sample`` of 32: the
   erasure's time, and the p50/p95 of those calls before and during it.
4. imports the file back (``agents.services.agent_import``, the vector index and replay
   trees caught up before it returns): items/s, memory items and experiences counted.

Every figure is printed with the load average: the machine is shared, compare within a run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from retrieval import setup_django  # noqa: E402 - after the path set-up
from search import _print_table, load_items, locomo_texts, percentiles  # noqa: E402

BIG, OTHER = "agent-big", "agent-other"
EXPERIENCE_BATCH = 1_000


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def load_experiences(agent_id: str, n: int, turns: list[str], seed: int) -> None:
    from experience.services import experience_create_many

    rng = np.random.default_rng(seed)
    for offset in range(0, n, EXPERIENCE_BATCH):
        items = [
            {
                "experience_id": f"{agent_id}-{i}",
                "agent_id": agent_id,
                "task": turns[i % len(turns)],
                "tool_calls": [{"name": "run", "arguments": {}, "output": f"ok {i}"}],
                "reward": float(rng.random()),
                "td_error": float(rng.standard_normal()),
            }
            for i in range(offset, min(n, offset + EXPERIENCE_BATCH))
        ]
        experience_create_many(items=items)


def load_memories(big: int, others: int, turns: list[str]) -> float:
    """Both agents' memory rows in one go (load_items replaces every item and spreads them
    round-robin over its list: the list holds the two agents in proportion)."""
    step = max(1, big // max(1, others))
    return load_items(big + others, [BIG] * step + [OTHER], turns, seed=1)


class Reader(threading.Thread):
    """Serves the other agent in a loop: a hybrid search, then a replay draw."""

    def __init__(self, questions: list[str]) -> None:
        super().__init__(daemon=True)
        self.questions = questions
        self.search_ms: list[float] = []
        self.replay_ms: list[float] = []
        self.running = True
        self.errors = 0

    def run(self) -> None:
        from django.db import connection

        from experience.selectors import replay_sample
        from memory.selectors import memory_search

        i = 0
        while self.running:
            question = self.questions[i % len(self.questions)]
            start = time.perf_counter_ns()
            try:
                memory_search(query=question, agent_id=OTHER, limit=10, mode="hybrid")
                self.search_ms.append((time.perf_counter_ns() - start) / 1e6)
                start = time.perf_counter_ns()
                replay_sample(
                    strategy="prioritized",
                    batch_size=32,
                    alpha=0.6,
                    beta=0.4,
                    half_life=3600.0,
                    agent_id=OTHER,
                    seed=i,
                )
                self.replay_ms.append((time.perf_counter_ns() - start) / 1e6)
            except Exception as exc:  # noqa: BLE001 - a bench counts failures, it does not stop
                self.errors += 1
                print(f"reader: {type(exc).__name__}: {exc}", file=sys.stderr)
            i += 1
        connection.close()


def served(seconds: float, questions: list[str]) -> Reader:
    reader = Reader(questions)
    reader.start()
    time.sleep(seconds)
    reader.running = False
    reader.join()
    return reader


def fmt(times: list[float]) -> str:
    if len(times) < 2:
        return "-"
    p50, p95 = percentiles(times)
    return f"{p50:.1f} / {p95:.1f} ({len(times)})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000, help="memory items and experiences")
    parser.add_argument("--others", type=int, default=10_000, help="the other agent's, each")
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="ferrum-bench-lifecycle-")
    setup_django(data_dir, keep_near_duplicates=False)

    from search import build_index

    from agents.selectors import agent_export
    from agents.services import agent_erase, agent_import
    from experience.replay_index import get_replay_index
    from memory.models import MemoryItem

    turns, questions = locomo_texts()
    print(f"data folder {data_dir}; load average {load_average()}")
    seconds = load_memories(args.items, args.others, turns)
    print(f"memory rows written in {seconds:.1f} s")
    load_experiences(BIG, args.items, turns, seed=2)
    load_experiences(OTHER, args.others, turns, seed=3)
    print(f"index built in {build_index():.1f} s; load average {load_average()}")
    get_replay_index().catch_up()
    big_items = MemoryItem.objects.filter(agent_id=BIG).count()
    rows = []

    before = served(args.baseline_seconds, questions)
    rows.append(
        (
            "other agent served, before",
            "-",
            "-",
            fmt(before.search_ms),
            fmt(before.replay_ms),
            load_average(),
        )
    )

    export_file = Path(data_dir) / "export.jsonl"
    start = time.perf_counter()
    with export_file.open("wb") as out:
        for line in agent_export(agent_id=BIG):
            out.write(line)
    export_s = time.perf_counter() - start
    exported = big_items + args.items
    rows.append(
        (f"export {BIG}", f"{export_s:.1f}", f"{exported / export_s:.0f}", "-", "-", load_average())
    )

    reader = Reader(questions)
    reader.start()
    start = time.perf_counter()
    erasure = agent_erase(agent_id=BIG, actor="bench")
    erase_s = time.perf_counter() - start
    reader.running = False
    reader.join()
    counts = erasure.record.counts
    rows.append(
        (
            f"erase {BIG} ({counts['memory_items']} items, {counts['experiences']} exp.)",
            f"{erase_s:.1f}",
            f"{(counts['memory_items'] + counts['experiences']) / erase_s:.0f}",
            fmt(reader.search_ms),
            fmt(reader.replay_ms),
            load_average(),
        )
    )

    start = time.perf_counter()
    with export_file.open("rb") as lines:
        result = agent_import(agent_id=BIG, lines=lines)
    import_s = time.perf_counter() - start
    imported = result.imported["memory_items"] + result.imported["experiences"]
    rows.append(
        (
            f"import {BIG} (index and trees caught up)",
            f"{import_s:.1f}",
            f"{imported / import_s:.0f}",
            "-",
            "-",
            load_average(),
        )
    )

    print()
    _print_table(
        (
            "step",
            "seconds",
            "items/s",
            "other's search p50/p95 ms (n)",
            "other's replay p50/p95 ms (n)",
            "load average",
        ),
        rows,
    )
    size = export_file.stat().st_size / 1e6
    print(f"\nreader errors: {before.errors + reader.errors}; export file {size:.0f} MB")


if __name__ == "__main__":
    main()
