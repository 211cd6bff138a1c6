"""The soak's allocation tracer (``--tracemalloc``), started in a web worker
(bench/soak_gunicorn.py) or a Celery pool process (bench/soak_celery.py) when
SOAK_TRACEMALLOC_DIR is set: from SOAK_TRACEMALLOC_START seconds on (the warm-up) it traces
allocations and takes a baseline, then every SOAK_TRACEMALLOC_EVERY seconds writes the
allocation sites that grew most since, to <role>-tracemalloc-<pid>.txt in that folder.
Tracing slows the process and costs memory of its own: a run to find a leak, not to measure
slopes."""

import linecache
import os
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 12  # deep enough to see past Django's and the libraries' frames to ours
TOP = 30


def _trace(target: Path, start: float, every: float) -> None:
    # Started after the warm-up, not at boot: tracing the models' loading would slow it
    # tenfold, and what is allocated before the baseline is no growth anyway.
    time.sleep(start)
    tracemalloc.start(FRAMES)
    baseline = tracemalloc.take_snapshot()
    began = time.monotonic()
    # The tracer's own: tracemalloc's, and the source lines its tracebacks read (linecache).
    skip = [tracemalloc.Filter(False, str(m.__file__)) for m in (tracemalloc, linecache)]
    while True:
        time.sleep(every)
        snapshot = tracemalloc.take_snapshot()
        diff = snapshot.filter_traces(skip).compare_to(baseline.filter_traces(skip), "traceback")
        current, peak = tracemalloc.get_traced_memory()
        lines = [
            f"{(time.monotonic() - began) / 60:.1f} min after the baseline; traced now "
            f"{current / 2**20:.1f} MB (peak {peak / 2**20:.1f} MB); "
            f"growth in all sites {sum(d.size_diff for d in diff) / 2**20:+.2f} MB",
        ]
        for stat in diff[:TOP]:
            lines.append(
                f"\n{stat.size_diff / 1024:+.1f} KiB ({stat.count_diff:+d} blocks), "
                f"now {stat.size / 1024:.1f} KiB"
            )
            lines += [f"    {line}" for line in stat.traceback.format(most_recent_first=True)]
        target.with_suffix(".tmp").write_text("\n".join(lines) + "\n")
        target.with_suffix(".tmp").replace(target)


def start_tracing(role: str) -> None:
    """Starts the tracer thread in this process, if SOAK_TRACEMALLOC_DIR is set."""
    folder = os.environ.get("SOAK_TRACEMALLOC_DIR")
    if not folder:
        return
    target = Path(folder) / f"{role}-tracemalloc-{os.getpid()}.txt"
    start = float(os.environ.get("SOAK_TRACEMALLOC_START", "300"))
    every = float(os.environ.get("SOAK_TRACEMALLOC_EVERY", "300"))
    threading.Thread(target=_trace, args=(target, start, every), daemon=True).start()
