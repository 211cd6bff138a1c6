"""The service's own Prometheus metrics, beyond django-prometheus's defaults.

Each is named in the README. Under gunicorn they are summed over the workers through
PROMETHEUS_MULTIPROC_DIR (see gunicorn.conf.py); the Celery worker serves its own on
WORKER_METRICS_BIND.
"""

import functools

from prometheus_client import Counter, Gauge, Histogram

# Seconds: from a cached replay draw (~1 ms) to a slow consolidation.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

API_REQUEST_SECONDS = Histogram(
    "ferrum_api_request_duration_seconds",
    "Time to answer an API request, by operation (the route), method and status code.",
    ["operation", "method", "status"],
    buckets=LATENCY_BUCKETS,
)


@functools.cache
def api_request_seconds(operation: str, method: str, status: int) -> Histogram:
    """One series of API_REQUEST_SECONDS, looked up once (each label is a bounded set: routes,
    verbs, status codes). Every request observes it: the only metric a request writes."""
    return API_REQUEST_SECONDS.labels(operation=operation, method=method, status=status)


REPLAY_SAMPLE_SECONDS = Histogram(
    "ferrum_replay_sample_duration_seconds",
    "Time to draw one replay batch (index catch-up included), by strategy.",
    ["strategy"],
    buckets=LATENCY_BUCKETS,
)


@functools.cache
def replay_sample_seconds(strategy: str) -> Histogram:
    """The histogram of one strategy, looked up once: on the ~1 ms replay path `labels()`
    costs more than `observe()`."""
    return REPLAY_SAMPLE_SECONDS.labels(strategy=strategy)


EMBEDDING_SECONDS = Histogram(
    "ferrum_embedding_duration_seconds",
    "Time to embed one batch of documents or one query.",
    ["kind"],
    buckets=LATENCY_BUCKETS,
)
EMBEDDING_BATCH_SIZE = Histogram(
    "ferrum_embedding_batch_size",
    "Texts embedded in one call.",
    ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
INDEX_LAG = Gauge(
    "ferrum_index_lag_revisions",
    "DB revision minus the revision this process's index applied, after its last catch-up: "
    "0 when it caught up, the backlog while catching up fails.",
    ["index"],
    # One series per live process: each web and worker process keeps its own index.
    multiprocess_mode="liveall",
)
TASK_RUNS = Counter(
    "ferrum_task_runs",
    "Celery task runs by task name and outcome (success, failure, retry): consolidations are "
    "sessions.consolidate, dream-cycle runs experience.dream_cycles.",
    ["task", "outcome"],
)
DREAM_CYCLES = Counter(
    "ferrum_dream_cycles",
    "Dream cycles recorded (one per agent and run; failed runs count in ferrum_task_runs).",
)
WORKING_MEMORY_ERRORS = Counter(
    "ferrum_working_memory_errors",
    "Working-memory store calls that failed because the store did not answer.",
    ["engine"],
)
