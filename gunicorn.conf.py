"""gunicorn settings for the web process; each one can be overridden on the command line."""

import gc
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from gunicorn.glogging import Logger

from ferrum_memory.core.logs import logging_config

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
timeout = 60
# JSON lines like the rest of the service. The application logs one access line per request
# with its request id and trace id (ferrum_memory.access), so gunicorn's own is silenced.
logconfig_dict = {
    **logging_config(os.environ.get("LOG_LEVEL", "INFO")),
    "loggers": {
        "gunicorn.error": {"propagate": True},
        "gunicorn.access": {"propagate": False, "level": "CRITICAL"},
    },
}


class AppAccessLogger(Logger):
    """gunicorn's logger less its access line, which the application writes. With a
    logconfig_dict gunicorn still built each request's line (its atoms) before the CRITICAL
    level dropped it: 4% of a trivial request's worker time (py-spy)."""

    access_log_enabled = False


logger_class = AppAccessLogger

# Off: the app (and tracing, whose export thread does not survive a fork) loads in each worker.
preload_app = False


def _default_metrics_dir() -> str:
    """Memory, not the data folder: the metric files are sparse and memory-mapped, so a worker
    writing a new page of one on a full disk dies of SIGBUS, and so does every worker booted
    after it (tests/faults/test_disk_full.py). One folder per data folder: two services on one
    host keep their metrics apart."""
    data_dir = Path(os.environ.get("FERRUM_DATA_DIR", "var")).resolve()
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else Path(tempfile.gettempdir())
    return str(base / f"ferrum-memory-web-{hashlib.sha256(bytes(data_dir)).hexdigest()[:12]}")


# Each worker process has its own Prometheus registry; multiprocess mode makes /metrics add
# them up. The variable must be set before prometheus_client is imported in the workers.
_metrics_dir = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or _default_metrics_dir())
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_metrics_dir)


def on_starting(server: object) -> None:
    shutil.rmtree(_metrics_dir, ignore_errors=True)
    _metrics_dir.mkdir(parents=True)


def on_exit(server: object) -> None:
    shutil.rmtree(_metrics_dir, ignore_errors=True)  # memory, not a file the data folder drops


def child_exit(server: object, worker: object) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]


def post_worker_init(worker: object) -> None:
    from memory.embeddings import warm_up

    warm_up()  # before the freeze below: the model's objects are long-lived too
    # Django's ~100k long-lived objects out of the collector's sight: otherwise every full
    # collection walks them all (150 ms on a 2-CPU machine), about every 20 replay requests,
    # since a replay request allocates thousands of containers.
    gc.collect()
    gc.freeze()
    from ferrum_memory.core.storage import hold_wal_files_in_this_process

    hold_wal_files_in_this_process()  # reads go on when the disk is full (core/storage.py)
