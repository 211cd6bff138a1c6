"""Replay benchmark: ``python bench/replay.py [--part tree ...]``.

Each part is one function that prints one table; ``main`` runs the parts asked for.

- ``tree``: the in-process index alone. For N = 10^4, 10^5, 10^6, the median time to sample a
  batch of 256 and to update 256 priorities, for our numpy ``PriorityIndex``, cpprb's C++
  ``PrioritizedReplayBuffer`` and a naive numpy ``rng.choice`` that renormalises every time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

# Run as a plain script from anywhere: make the project importable.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6  # DESIGN.md defaults


def median_ms(fn: Callable[[int], object], repeats: int, warmup: int = 5) -> float:
    """Median wall time of ``fn(i)`` in ms; ``i`` selects pre-generated input, so input
    generation stays outside the timed region."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(repeats):
        start = time.perf_counter_ns()
        fn(i)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e6


def _tree_rows(n: int, batch: int, repeats: int, seed: int) -> Iterator[tuple[str, float, float]]:
    from experience.sumtree import PriorityIndex, importance_weights

    rng = np.random.default_rng(seed)
    td = rng.exponential(1.0, n)  # |TD error| of the stored items
    keys = np.arange(1, n + 1, dtype=np.int64)  # database primary keys
    # Pre-generated update batches: which items got new TD errors, and the errors.
    slots = rng.integers(0, n, size=(repeats + 10, batch))
    new_td = rng.exponential(1.0, size=(repeats + 10, batch))

    index = PriorityIndex()
    index.build(keys, (td + EPS) ** ALPHA)

    def ours_sample(_: int) -> object:
        # A replay sample needs IS weights too (cpprb computes them), so they are timed here.
        sampled, probs = index.sample(batch, rng)
        return sampled, importance_weights(probs, len(index), BETA, index.min_probability())

    def ours_update(i: int) -> None:
        index.upsert(keys[slots[i]], (new_td[i] + EPS) ** ALPHA)

    yield "PriorityIndex (numpy)", median_ms(ours_sample, repeats), median_ms(ours_update, repeats)

    try:
        from cpprb import PrioritizedReplayBuffer
    except ImportError:
        yield "cpprb: not installed (pip install cpprb)", float("nan"), float("nan")
    else:
        # cpprb raises (|td| + eps) to alpha itself; its buffer needs at least one field.
        buffer = PrioritizedReplayBuffer(n, {"key": {"dtype": np.int64}}, alpha=ALPHA, eps=EPS)
        buffer.add(key=keys, priorities=td)

        def cpprb_sample(_: int) -> object:
            return buffer.sample(batch, beta=BETA)

        def cpprb_update(i: int) -> None:
            buffer.update_priorities(slots[i], new_td[i])

        version = importlib.metadata.version("cpprb")
        label = f"cpprb {version} PrioritizedReplayBuffer"
        yield label, median_ms(cpprb_sample, repeats), median_ms(cpprb_update, repeats)

    p = (td + EPS) ** ALPHA

    def naive_sample(_: int) -> object:
        return rng.choice(n, batch, p=p / p.sum())  # O(N): renormalise on every draw

    def naive_update(i: int) -> None:
        p[slots[i]] = (new_td[i] + EPS) ** ALPHA

    yield (
        "naive numpy rng.choice",
        median_ms(naive_sample, repeats),
        median_ms(naive_update, repeats),
    )


def part_tree(args: argparse.Namespace) -> None:
    """Print the in-process replay index table."""
    print(f"\n## tree: batch {args.batch}, median of {args.repeats} repeats, times in ms\n")
    print(f"| {'N':>9} | {'implementation':<38} | {'sample':>8} | {'update':>8} |")
    print(f"|{'-' * 11}|{'-' * 40}|{'-' * 10}|{'-' * 10}|")
    for n in args.sizes:
        for name, sample_ms, update_ms in _tree_rows(n, args.batch, args.repeats, args.seed):
            print(f"| {n:>9,} | {name:<38} | {sample_ms:>8.3f} | {update_ms:>8.3f} |")
    print(
        "\nsample: ours = keys + probabilities + IS weights; cpprb = indexes + IS weights + the "
        "stored field; naive = indexes only.\nupdate: ours = key lookup + (|td|+eps)^alpha + "
        "tree walk; naive = one array assignment."
    )


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {"tree": part_tree}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--part", nargs="+", choices=sorted(PARTS), default=["tree"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10**4, 10**5, 10**6])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    for part in args.part:
        PARTS[part](args)


if __name__ == "__main__":
    main()
