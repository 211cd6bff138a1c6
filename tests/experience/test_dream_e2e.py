"""End to end with real processes: a Celery worker and beat (DatabaseScheduler) run a scheduled
dream cycle on the test database; a learner claims it over the API and reports TD errors; the
next replay request samples with the new priorities, and the worker counts its draws."""

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from kombu import Connection

from experience.models import DreamCycle, Experience
from experience.services import experience_mark_sampled_flush, priority_from_td_error
from ferrum_memory.celery import app
from tests.experience.factories import experience_jsons

ROOT = Path(__file__).resolve().parents[2]
AGENT = "dreamer"
SCHEDULE = "experience: dream cycles"
WAIT_SECONDS = 90


def process_env(tmp_path: Path) -> dict[str, str]:
    """The worker's and beat's environment: the test's database, a broker of their own."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ferrum_memory.settings.base",
        "FERRUM_DATA_DIR": str(tmp_path / "data"),
        "DREAM_MIN_EXPERIENCES": "10",
        "DREAM_BATCH_SIZE": "8",
        "DREAM_MAX_PENDING": "3",
        "DREAM_BETA0": "0.4",
        "PYTHONUNBUFFERED": "1",
    }
    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite":
        env.pop("DATABASE_URL", None)
        env["SQLITE_PATH"] = name  # the file pytest-django made (settings/test.py)
    else:
        url = urlsplit(os.environ["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(url._replace(path=f"/{name}"))
    redis_url = os.environ.get("REDIS_URL", "")
    env["CELERY_BROKER_URL"] = redis_url or f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    return env


def empty_broker(url: str) -> None:
    """Drop what earlier runs left on a shared Redis broker before a worker starts: a message
    a killed worker held is handed to the next worker once Redis's visibility timeout (1 hour)
    has passed, and that worker would run it before the test's own. A SQLite broker is a new
    file per test and starts empty."""
    if not url.startswith("redis"):
        return
    with Connection(url) as conn:
        channel = conn.default_channel
        channel.queue_purge(app.conf.task_default_queue)
        channel.client.delete(channel.unacked_key, channel.unacked_index_key)


CELERY = [sys.executable, "-m", "celery", "-A", "ferrum_memory"]


def worker_command(name: str) -> list[str]:
    """A Celery worker whose solo pool runs each task in the worker process itself."""
    return [
        *CELERY,
        "worker",
        "--pool=solo",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        f"--hostname={name}-{os.getpid()}@%h",
    ]


@contextmanager
def celery_processes(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Start a worker and a beat; give a function returning their logs; always stop them."""
    env = process_env(tmp_path)
    commands = {
        "worker": worker_command("e2e"),
        "beat": [
            *CELERY,
            "beat",
            "-S",
            "django_celery_beat.schedulers:DatabaseScheduler",
            "--loglevel=INFO",
            "--max-interval=1",
            f"--pidfile={tmp_path / 'beat.pid'}",
        ],
    }
    logs = {name: tmp_path / f"{name}.log" for name in commands}
    empty_broker(env["CELERY_BROKER_URL"])
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def read_logs() -> str:
        dead = {n: p.returncode for n, p in processes.items() if p.poll() is not None}
        text = "".join(f"--- {n} ---\n{path.read_text()[-4000:]}\n" for n, path in logs.items())
        return f"exited: {dead}\n{text}"

    try:
        for name, command in commands.items():
            with logs[name].open("wb") as log:
                processes[name] = subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                )
            if name == "worker":
                # Beat starts once the worker has declared the queue: on a new SQLite broker
                # both would create it at once, and kombu's SQLAlchemy transport leaves the
                # loser's session broken for good (IntegrityError, then PendingRollbackError).
                wait_for(lambda: " ready." in logs["worker"].read_text(), read_logs, "the worker")
        yield read_logs
    finally:
        for process in processes.values():
            stop_process(process, timeout=20)


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (a graceful shutdown), then SIGKILL if it is not done within `timeout`."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def wait_for(condition: Callable[[], Any], logs: Callable[[], str], what: str) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.5)
    pytest.fail(f"Timed out after {WAIT_SECONDS}s waiting for {what}.\n{logs()}")


@pytest.fixture
def celery_processes_after_setup(
    api_client: Any, transactional_db: None, tmp_path: Path
) -> Iterator[Callable[[], str]]:
    """Experiences in, the dream schedule set to every second (as an admin would), other
    schedules off; then the worker and beat start."""
    experiences = experience_jsons(12, agent_id=AGENT)
    assert api_client.post("/experience/", experiences, format="json").status_code == 201
    every_second, _ = IntervalSchedule.objects.get_or_create(
        every=1, period=IntervalSchedule.SECONDS
    )
    schedule = PeriodicTask.objects.get(name=SCHEDULE)
    schedule.interval = every_second
    schedule.save()
    PeriodicTask.objects.exclude(name=SCHEDULE).update(enabled=False)
    with celery_processes(tmp_path) as logs:
        yield logs


@pytest.mark.django_db(transaction=True)
def test_a_scheduled_dream_reaches_the_learner_and_its_td_errors_reach_replay(
    api_client, celery_processes_after_setup, send_tasks_to, tmp_path
):
    logs = celery_processes_after_setup

    # A scheduled cycle is recorded by the worker and its draws are marked sampled.
    cycle = wait_for(
        lambda: DreamCycle.objects.filter(agent_id=AGENT).order_by("id").first(),
        logs,
        "the beat's first dream cycle",
    )
    assert cycle.buffer_size == 12 and cycle.beta == pytest.approx(0.4)
    drawn = list(cycle.items.values_list("experience_pk", flat=True))
    assert len(drawn) == 8
    sampled = dict(Experience.objects.filter(pk__in=drawn).values_list("pk", "times_sampled"))
    assert all(sampled[pk] >= drawn.count(pk) for pk in set(drawn))

    # The learner claims the oldest cycle and reports TD errors for it.
    claim = api_client.post("/dream/cycles/claim", {"agent_id": AGENT}, format="json")
    assert claim.status_code == 200, claim.json()
    body = claim.json()
    assert body["id"] == cycle.pk
    ids = sorted({item["experience_id"] for item in body["items"]})
    td_errors = {eid: 0.01 for eid in ids} | {ids[0]: 25.0}
    reported = api_client.post(
        f"/dream/cycles/{cycle.pk}/td-errors",
        {
            "lease_token": body["lease_token"],
            "td_errors": [{"experience_id": k, "td_error": v} for k, v in td_errors.items()],
        },
        format="json",
    )
    assert reported.status_code == 200, reported.json()
    assert reported.json()["cycle"]["status"] == "completed"

    # The next replay request samples with the new priorities; the worker counts its draws.
    counted = dict(Experience.objects.values_list("experience_id", "times_sampled"))
    send_tasks_to(process_env(tmp_path)["CELERY_BROKER_URL"])
    replay = api_client.get(f"/experience/replay?agent_id={AGENT}&batch_size=64&seed=3").json()
    experience_mark_sampled_flush()  # the web process's tally, at once rather than within 1 s
    priorities = dict(
        Experience.objects.filter(agent_id=AGENT).values_list("experience_id", "priority")
    )
    total = sum(priorities.values())
    for eid, value in td_errors.items():
        assert priorities[eid] == pytest.approx(priority_from_td_error(value))
    for item in replay["items"]:
        eid = item["experience"]["id"]
        assert item["probability"] == pytest.approx(priorities[eid] / total)
    top = max(replay["items"], key=lambda item: item["probability"])
    assert top["experience"]["id"] == ids[0]
    worker_log = tmp_path / "worker.log"
    wait_for(
        lambda: re.search(
            r"Task experience\.mark_sampled\[\S+\] succeeded", worker_log.read_text()
        ),
        logs,
        "the worker to count the replay's draws",
    )
    now = dict(Experience.objects.values_list("experience_id", "times_sampled"))
    replayed = Counter(item["experience"]["id"] for item in replay["items"])
    assert all(now[eid] >= counted[eid] + n for eid, n in replayed.items())  # dreams count too

    # Beat keeps dreaming on schedule: later cycles follow, up to the backlog limit.
    wait_for(
        lambda: DreamCycle.objects.filter(agent_id=AGENT, number__gte=2).exists(),
        logs,
        "a second scheduled cycle",
    )
