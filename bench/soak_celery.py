"""``python bench/soak_celery.py worker ...``: the service's Celery app as ``celery -A
ferrum_memory`` runs it, with each pool process tracing its allocations (bench/soak_trace.py);
bench/soak.py starts the worker so with ``--tracemalloc``."""

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from celery.signals import worker_process_init  # noqa: E402 - after the path set-up
from soak_trace import start_tracing  # noqa: E402

from ferrum_memory.celery import app  # noqa: E402


@worker_process_init.connect
def _trace_pool_process(**_: Any) -> None:
    start_tracing("pool")


if __name__ == "__main__":
    app.worker_main(sys.argv[1:])
