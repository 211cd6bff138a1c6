"""The qdrant-edge shard alone under churn: ``python bench/index_churn.py [--iterations 12000]``.

Does an index server's heap grow with flat data because of the engine? This drives one
EdgeEngine as an index server does, without the DB, the sockets or the threads: a sliding
window of ``--window`` live points of 4 agents (random unit vectors of 384 floats, a third of
the points with 3 sentence vectors, 20 BM25 terms, the service's payload), and at each step
``--per-step`` points added and as many of the oldest deleted (as the soak's TTL purge does),
``--searches`` hybrid searches (the pool query, then the pool's BM25 and best-sentence scores),
the state saved (a flush), and the graphs built with the shard reopened once the steps have
added or deleted OPTIMIZE_AFTER_POINTS (as the index server's optimizer thread does). Prints the
process's heap (RssAnon) and VmRSS every ``--sample`` steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrieval import setup_django  # noqa: E402 - after the path set-up

AGENTS = [f"agent-{i}" for i in range(4)]


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=1500, help="live points")
    parser.add_argument("--iterations", type=int, default=12_000, help="steps")
    parser.add_argument("--per-step", type=int, default=3, help="points added (and deleted)")
    parser.add_argument("--searches", type=int, default=2, help="hybrid searches a step")
    parser.add_argument("--sample", type=int, default=2000, help="steps between samples")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrum-churn-") as data_dir:
        setup_django(data_dir)
        from memory import vector_index as vi
        from memory.embeddings import SparseVector

        rng = np.random.default_rng(0)

        def unit(rows: int) -> np.ndarray:
            vectors = rng.standard_normal((rows, 384)).astype(np.float32)
            return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

        def point(n: int) -> vi.IndexPoint:
            now = time.time()
            terms = sorted(rng.choice(30_000, size=20, replace=False).tolist())
            return vi.IndexPoint(
                uuid.uuid4(),
                unit(1)[0].tolist(),
                SparseVector(terms, rng.random(20).tolist()),
                {
                    "agent_id": AGENTS[n % len(AGENTS)],
                    "kind": "episodic",
                    "tags": [f"t{n % 7}"],
                    "session_id": f"s{n // 20}",
                    "importance": 0.5,
                    "created_at": now,
                    "expires_at": now + 300,
                },
                [] if n % 3 else unit(3).tolist(),
            )

        engine = vi.EdgeEngine(Path(data_dir) / "qdrant-edge")
        engine.reset(384)
        index = vi.VectorIndex(engine, optimize_inline=False)
        live = [point(n) for n in range(args.window)]
        engine.upsert(live)
        engine.optimize()
        live_ids = [p.id for p in live]
        added, unoptimized, builds, began = args.window, 0, 0, time.perf_counter()
        print(f"# bench/index_churn.py, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("| step | points added | heap (RssAnon) MB | VmRSS MB | graph builds | s |")
        print("|---|---|---|---|---|---|")
        for step in range(args.iterations + 1):
            new = [point(added + k) for k in range(args.per_step)]
            added += args.per_step
            engine.upsert(new)
            engine.delete(live_ids[: args.per_step])
            live_ids = live_ids[args.per_step :] + [p.id for p in new]
            unoptimized += 2 * args.per_step
            for s in range(args.searches):
                query = point(0)
                flt = vi.SearchFilter(agent_id=AGENTS[s % len(AGENTS)], now=time.time())
                index._hybrid_search(
                    dense=query.dense, sparse=query.sparse, tokens=[], flt=flt, limit=10
                )
            engine.save_state({"cursor": step, "model": "churn"})
            if unoptimized >= vi.OPTIMIZE_AFTER_POINTS:
                engine.optimize()  # builds, then reopens the shard and trims the C heap
                unoptimized, builds = 0, builds + 1
            if step % args.sample == 0:
                print(
                    f"| {step:,} | {added:,} | {_status_mb('RssAnon'):.1f} | "
                    f"{_status_mb('VmRSS'):.1f} | {builds} | {time.perf_counter() - began:.0f} |",
                    flush=True,
                )
        engine.close()
        print(f"\nload at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
