"""gunicorn settings for bench/soak.py: the service's own (gunicorn.conf.py, run here as it is),
and, with SOAK_TRACEMALLOC_DIR set, each web worker traces its allocations from
SOAK_TRACEMALLOC_START seconds after it boots (the warm-up) and takes a baseline, then every
SOAK_TRACEMALLOC_EVERY seconds the largest growths since the baseline, by allocation site,
written to tracemalloc-<pid>.txt in that folder. Tracing slows the worker and costs memory of
its own: a run to find a leak, not one to measure slopes."""

import os
import runpy
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

_service = runpy.run_path(str(Path(__file__).resolve().parents[1] / "gunicorn.conf.py"))
globals().update({k: v for k, v in _service.items() if not k.startswith("__")})

FRAMES = 12  # deep enough to see past Django's and the libraries' frames to ours
TOP = 30


def _trace(folder: Path, start: float, every: float) -> None:
    # Started after the warm-up, not at boot: tracing the models' loading would slow it
    # tenfold, and what is allocated before the baseline is no growth anyway.
    time.sleep(start)
    tracemalloc.start(FRAMES)
    baseline = tracemalloc.take_snapshot()
    began = time.monotonic()
    skip = [tracemalloc.Filter(False, tracemalloc.__file__)]
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
        target = folder / f"tracemalloc-{os.getpid()}.txt"
        target.with_suffix(".tmp").write_text("\n".join(lines) + "\n")
        target.with_suffix(".tmp").replace(target)


def post_worker_init(worker: Any) -> None:
    _service["post_worker_init"](worker)
    folder = os.environ.get("SOAK_TRACEMALLOC_DIR")
    if not folder:
        return
    start = float(os.environ.get("SOAK_TRACEMALLOC_START", "300"))
    every = float(os.environ.get("SOAK_TRACEMALLOC_EVERY", "300"))
    threading.Thread(target=_trace, args=(Path(folder), start, every), daemon=True).start()
