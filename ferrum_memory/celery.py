"""The Celery app. Configured from the CELERY_* Django settings; tasks live in each app.

Also the worker's and beat's observability: tracing set up in the process that runs the tasks,
the enqueuing request's id carried to the task in a message header, task outcomes counted,
and the worker's metrics served on WORKER_METRICS_BIND.
"""

import logging
import os
from pathlib import Path
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")

app = Celery("ferrum_memory")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

REQUEST_ID_HEADER = "request_id"
logger = logging.getLogger(__name__)


@signals.worker_init.connect
def _worker_init(sender: Any, **kwargs: Any) -> None:
    from celery.concurrency import get_implementation
    from celery.concurrency.prefork import TaskPool

    from ferrum_memory.core.storage import hold_wal_files_in_this_process
    from ferrum_memory.core.telemetry import setup_tracing

    hold_wal_files_in_this_process()  # a prefork child keeps the signal and opens its own
    prefork = issubclass(get_implementation(sender.pool_cls), TaskPool)
    if not prefork:
        setup_tracing()  # solo or threads: the tasks run in this process
    _serve_metrics(prefork=prefork)


@signals.worker_process_init.connect
def _worker_process_init(**kwargs: Any) -> None:
    from ferrum_memory.core.telemetry import setup_tracing

    setup_tracing()  # a prefork child, after the fork


@signals.worker_process_shutdown.connect
def _worker_process_shutdown(**kwargs: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())


@signals.beat_init.connect
def _beat_init(**kwargs: Any) -> None:
    from ferrum_memory.core.telemetry import setup_tracing

    setup_tracing()  # a scheduled flow's trace starts at beat's publish


def _process_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _serve_metrics(*, prefork: bool) -> None:
    """Serve this worker's metrics on WORKER_METRICS_BIND (host:port). With prefork children
    they need PROMETHEUS_MULTIPROC_DIR set, to a folder of the worker's own (not the web's)."""
    from django.conf import settings
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess, start_http_server

    if not settings.WORKER_METRICS_BIND:
        return
    registry = REGISTRY
    if folder := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Files of earlier runs would be added to this run's counters; files of live processes
        # stay (another worker's, or gunicorn's if the folder is shared by mistake).
        for stale in Path(folder).glob("*.db"):
            if not _process_alive(stale.stem.rpartition("_")[2]):
                stale.unlink(missing_ok=True)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    elif prefork:
        logger.warning(
            "WORKER_METRICS_BIND without PROMETHEUS_MULTIPROC_DIR: the metrics of the prefork "
            "children, which run the tasks, are not served"
        )
    host, _, port = settings.WORKER_METRICS_BIND.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)


@signals.before_task_publish.connect
def _send_request_id(headers: dict[str, Any], **kwargs: Any) -> None:
    from ferrum_memory.core.logs import request_id

    if (value := request_id.get()) is not None:
        headers.setdefault(REQUEST_ID_HEADER, value)


_log_context: dict[str, tuple[Any, Any]] = {}


@signals.task_prerun.connect
def _task_log_context(task_id: str, task: Any, **kwargs: Any) -> None:
    from ferrum_memory.core import logs

    # The enqueuing request's id; an eager task keeps the current one; a beat job has its own.
    value = getattr(task.request, REQUEST_ID_HEADER, None) or logs.request_id.get() or task_id
    _log_context[task_id] = (logs.request_id.set(value), logs.task_id.set(task_id))


@signals.task_postrun.connect
def _task_log_context_end(task_id: str, **kwargs: Any) -> None:
    from ferrum_memory.core import logs

    if tokens := _log_context.pop(task_id, None):
        logs.request_id.reset(tokens[0])
        logs.task_id.reset(tokens[1])


def _count(outcome: str) -> Any:
    def receiver(sender: Any, **kwargs: Any) -> None:
        from ferrum_memory.core.metrics import TASK_RUNS

        TASK_RUNS.labels(task=sender.name, outcome=outcome).inc()

    return receiver


# weak=False: the receivers are closures that nothing else holds.
signals.task_success.connect(_count("success"), weak=False)
signals.task_failure.connect(_count("failure"), weak=False)
signals.task_retry.connect(_count("retry"), weak=False)
