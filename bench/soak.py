"""Soak: ``python bench/soak.py [--config embedded postgres] [--minutes 30] [--rate 20]``.

The service as deployed (the Procfile: gunicorn, a Celery worker with its prefork pool, beat
with the database scheduler), once on the embedded defaults (SQLite, the SQLite broker,
qdrant-edge, working memory in the database) and once on PostgreSQL + Redis (``--database``,
dropped and created; ``--redis-url``, flushed: both the bench's own). A few client threads
send a mixed load at a fixed total rate (``--rate`` requests/s, so the soak measures whether
the service stays flat, not how fast it goes): memories stored, fetched, searched and packed
into a context; sessions started, updated and closed (the worker consolidates them);
experiences ingested (a share sent twice at once, as a client retrying), replayed and their
TD errors updated.

Every ``--sample-seconds`` (60) it samples, per process (gunicorn master and workers, the
Celery worker and its pool, beat): resident memory (VmRSS) and open file descriptors, from
/proc; and the database connections (PostgreSQL: pg_stat_activity of the bench's database;
SQLite: descriptors open on the database file, in every process of the service), beside the
rows stored so far. At the end: each series' least-squares slope per hour with its first and
last value, the 5xx count, and a check that every acknowledged write is in the database
exactly once. Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from load import Ledger, LoadClient, send  # noqa: E402 - after the path set-up
from replay import FOREIGN_ENV, PG_SERVER, _Client, _free_port, _manage  # noqa: E402
from retrieval import _print_table  # noqa: E402
from search import locomo_texts  # noqa: E402

# Relative weights of what a client does next.
MIX = {
    "memory store": 15,
    "memory get": 5,
    "memory search": 15,
    "memory context": 10,
    "session update": 20,  # every few updates the session is closed and another started
    "experience ingest": 15,
    "replay sample": 10,
    "td update": 10,
}
CONSOLIDATION_WAIT_SECONDS = 180
GUNICORN_ARGS = ("ferrum_memory.wsgi:application", "--config", "gunicorn.conf.py")
BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"


def _env_without_foreign() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}


# Load ----------------------------------------------------------------------------------------


class Pacer:
    """Hands out send times `1 / rate` apart to every client thread: the total rate is fixed
    however fast the service answers (slower, and the clients just wait on their answers)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def wait(self) -> None:
        with self.lock:
            now = time.monotonic()
            at = max(self.next, now)
            self.next = at + self.interval
        time.sleep(max(0.0, at - now))


@dataclass
class SoakLedger(Ledger):
    td_errors: dict[str, float] = field(default_factory=dict)  # experience id: last acked

    def merge(self, other: Ledger) -> None:
        super().merge(other)
        if isinstance(other, SoakLedger):
            self.td_errors |= other.td_errors


class SoakClient(LoadClient):
    """load.py's client (one agent, one keep-alive connection, its own session and texts),
    paced, with the operations the soak adds: a memory fetched, a context, TD updates."""

    ledger: SoakLedger

    def __init__(self, number: int, pacer: Pacer, *args: Any) -> None:
        super().__init__(number, *args)
        self.pacer = pacer
        self.ledger = SoakLedger()
        self.memories: list[str] = []
        self.experiences: list[str] = []

    def call(self, op: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        self.pacer.wait()
        return send(self.http, self.ledger, op, method, path, body)

    def run(self, deadline: float) -> Ledger:
        self.start_session()
        ops, weights = list(MIX), list(MIX.values())
        while time.monotonic() < deadline:
            getattr(self, self.rng.choices(ops, weights)[0].replace(" ", "_"))()
        self.http.close()
        return self.ledger

    def memory_store(self) -> None:
        before = set(self.ledger.acked_memories)
        super().memory_store()
        self.memories += self.ledger.acked_memories - before

    def memory_get(self) -> None:
        if self.memories:
            self.call("memory get", "GET", f"/memory/{self.rng.choice(self.memories)}")

    def memory_context(self) -> None:
        self.call(
            "memory context",
            "POST",
            "/memory/context",
            {
                "agent_id": self.agent,
                "query": self.questions[self.rng.randrange(len(self.questions))],
                "token_budget": 1_000,
                "session_id": self.session,
            },
        )

    def experience_ingest(self) -> None:
        before = set(self.ledger.acked_experiences)
        super().experience_ingest()
        self.experiences += self.ledger.acked_experiences - before

    def td_update(self) -> None:
        if not self.experiences:
            return
        chosen = self.rng.sample(self.experiences, min(10, len(self.experiences)))
        updates = {eid: round(self.rng.gauss(0.0, 0.5), 6) for eid in chosen}
        status, _ = self.call(
            "td update",
            "PUT",
            "/experience/td-error",
            {"updates": [{"experience_id": k, "td_error": v} for k, v in updates.items()]},
        )
        if status == 200:
            self.ledger.td_errors |= updates


# The service's processes and what they hold ---------------------------------------------------


def _status_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return sorted(found)


def _fd_targets(pid: int) -> list[str]:
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:
            pass  # closed between the listing and the read
    return targets


@dataclass
class Service:
    """The three processes of the Procfile, each started as deployed."""

    processes: dict[str, subprocess.Popen[bytes]]
    port: int

    def pids(self) -> dict[str, int]:
        """Every process by role: a child is named by its rank among its parent's children,
        so a restarted one shows up as a new pid under the same name (counted apart)."""
        found = {}
        for role, process in self.processes.items():
            found[role] = process.pid
            for rank, child in enumerate(_children(process.pid), 1):
                found[f"{role} child {rank}"] = child
        return found


def _wait_until(condition: Callable[[], bool], what: str, logs: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            tail = "\n".join(logs.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"{what}: not ready within {seconds:.0f} s\n{tail}")
        time.sleep(0.5)


def _healthy(port: int) -> bool:
    try:
        status, _ = _Client(port, "").send("GET", "/health")
    except OSError:
        return False
    return status == 200


@contextmanager
def service(env: dict[str, str], folder: Path) -> Iterator[Service]:
    """gunicorn, the Celery worker and beat as the Procfile starts them; always stopped."""
    port = _free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    celery = [sys.executable, "-m", "celery", "-A", "ferrum_memory"]
    name = f"soak-{os.getpid()}@%h"
    commands = {
        # Its default control socket is one per user ($HOME/.gunicorn): leave it to others.
        "gunicorn": [gunicorn, *GUNICORN_ARGS, "--no-control-socket"],
        "worker": [*celery, "worker", "--loglevel=INFO", "--concurrency=2", f"--hostname={name}"],
        "beat": [*celery, "beat", "--loglevel=INFO", "--scheduler", BEAT_SCHEDULER],
    }
    envs = {"gunicorn": {**env, "GUNICORN_BIND": f"127.0.0.1:{port}"}}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for role, command in commands.items():
            with (folder / f"{role}.log").open("wb") as log:
                processes[role] = subprocess.Popen(
                    command, cwd=ROOT, env=envs.get(role, env), stdout=log, stderr=log
                )
        _wait_until(lambda: _healthy(port), "gunicorn", folder / "gunicorn.log", 120)
        _wait_until(
            lambda: " ready." in (folder / "worker.log").read_text(errors="replace"),
            "the worker",
            folder / "worker.log",
            120,
        )
        yield Service(processes, port)
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


class Database:
    """The bench's database, read outside the service: row counts, connections, the checks."""

    def __init__(self, name: str | None, sqlite_path: Path) -> None:
        self.name, self.sqlite_path = name, sqlite_path

    @contextmanager
    def connect(self) -> Iterator[Any]:
        if self.name is None:
            lite = sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30)
            try:
                yield lite
            finally:
                lite.close()
        else:
            import psycopg

            with psycopg.connect(f"{PG_SERVER} dbname={self.name}", autocommit=True) as conn:
                yield conn

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return list(conn.execute(sql).fetchall())

    def connections(self, svc: Service) -> int:
        """PostgreSQL: backends on the bench's database but this one. SQLite: descriptors open
        on the database file in the service's processes (one per connection)."""
        if self.name is not None:
            return int(
                self.rows(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )[0][0]
            )
        target = str(self.sqlite_path)
        return sum(_fd_targets(pid).count(target) for pid in svc.pids().values() if _alive(pid))


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _redis_clients(redis_url: str) -> int:
    """Connections on the bench's Redis database but the one asking."""
    import redis

    client = redis.Redis.from_url(redis_url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    clients = client.client_list()
    me = client.client_id()
    client.close()
    return sum(1 for c in clients if int(c.get("db", -1)) == db and int(c["id"]) != me)


@dataclass
class Samples:
    minutes: list[float] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)
    pids: dict[str, set[int]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)

    def add(self, minute: float, values: dict[str, float]) -> None:
        count = len(self.minutes)
        self.minutes.append(minute)
        for name, value in values.items():
            self.series.setdefault(name, [None] * count).append(value)
        for values_of in self.series.values():
            if len(values_of) == count:
                values_of.append(None)  # a process that was gone at this sample
        self.loads.append(os.getloadavg()[0])


def sample(svc: Service, db: Database, redis_url: str, samples: Samples, minute: float) -> None:
    values: dict[str, float] = {}
    for role, pid in svc.pids().items():
        try:
            rss = _status_kb(pid, "VmRSS") / 1024
            # The heap alone: the kernel drops and maps back shared-library pages (in VmRSS)
            # as the machine's memory pressure varies, which is no trend of the service's.
            anon = _status_kb(pid, "RssAnon") / 1024
            fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
        except FileNotFoundError:
            continue  # exited between the listing and the read
        samples.pids.setdefault(role, set()).add(pid)
        values[f"{role} RSS MB"] = rss
        values[f"{role} anon MB"] = anon
        values[f"{role} fds"] = fds
    values["database connections"] = db.connections(svc)
    if redis_url:
        values["redis connections"] = _redis_clients(redis_url)
    for table, name in (
        ("memory_memoryitem", "memory items"),
        ("experience_experience", "experiences"),
        ("agent_sessions_session", "sessions"),
    ):
        values[name] = db.rows(f"SELECT count(*) FROM {table}")[0][0]
    samples.add(minute, values)
    print(
        f"  minute {minute:5.1f}: load {os.getloadavg()[0]:.2f}, "
        + ", ".join(f"{k} {v:.0f}" for k, v in values.items() if "child" not in k),
        file=sys.stderr,
        flush=True,
    )


def slope_per_hour(minutes: list[float], values: list[float | None]) -> float | None:
    points = [(m, v) for m, v in zip(minutes, values, strict=True) if v is not None]
    if len(points) < 2:
        return None
    x, y = np.array(points, dtype=float).T
    return float(np.polyfit(x / 60.0, y, 1)[0])


# Checks --------------------------------------------------------------------------------------


def _id(value: Any) -> str:
    """One spelling of an id for both databases (SQLite keeps a uuid as 32 hex digits)."""
    try:
        return uuid.UUID(str(value)).hex
    except ValueError:
        return str(value)


def verify(ledger: SoakLedger, db: Database, port: int, key: str) -> list[tuple[str, str, bool]]:
    checks: list[tuple[str, str, bool]] = []
    server_errors = sum(n for (_, status), n in ledger.statuses.items() if status >= 500)
    checks.append(("no 5xx", f"{server_errors} responses with a 5xx", server_errors == 0))

    stored = Counter(r[0] for r in db.rows("SELECT experience_id FROM experience_experience"))
    missing = len(ledger.acked_experiences - stored.keys())
    twice = sum(1 for n in stored.values() if n > 1)
    unacked = len((stored.keys() & ledger.sent_experiences) - ledger.acked_experiences)
    checks.append(
        (
            "acknowledged experiences stored once",
            f"{len(ledger.acked_experiences):,} acknowledged: {missing} missing, {twice} twice, "
            f"{unacked} stored without an ack",
            missing == twice == unacked == 0,
        )
    )
    td = dict(db.rows("SELECT experience_id, td_error FROM experience_experience"))
    wrong_td = sum(1 for eid, value in ledger.td_errors.items() if td.get(eid) != value)
    checks.append(
        (
            "last acknowledged TD error kept",
            f"{len(ledger.td_errors):,} experiences updated: {wrong_td} not at their last value",
            wrong_td == 0,
        )
    )

    items = Counter(_id(r[0]) for r in db.rows("SELECT id FROM memory_memoryitem"))
    acked = {_id(m) for m in ledger.acked_memories}
    doubles = db.rows(
        "SELECT count(*) FROM (SELECT 1 FROM memory_memoryitem "
        "GROUP BY agent_id, content_hash HAVING count(*) > 1) AS d"
    )[0][0]
    lost = len(acked - items.keys())
    checks.append(
        (
            "acknowledged memories stored once",
            f"{len(acked):,} distinct items acknowledged ({ledger.merged_memories} stores merged "
            f"into an existing one): {lost} missing, {doubles} contents twice",
            lost == doubles == 0,
        )
    )

    versions = {_id(s): v for s, v in db.rows("SELECT id, version FROM agent_sessions_session")}
    client = _Client(port, key)
    wrong = []
    for sid, version in ledger.open_sessions.items():
        status, content = client.send("GET", f"/session/{sid}")
        state = json.loads(content) if status == 200 else {}
        if state.get("version") != version or versions.get(_id(sid)) != version:
            wrong.append(sid)
    client.close()
    checks.append(
        (
            "open sessions at their last acknowledged version",
            f"{len(ledger.open_sessions)} sessions, {len(wrong)} wrong (store and DB)",
            not wrong,
        )
    )

    closed = {_id(s): v for s, v in ledger.closed_sessions.items()}
    deadline = time.monotonic() + CONSOLIDATION_WAIT_SECONDS
    while True:  # the worker consolidates what was closed during the run
        done = [
            (_id(s), v, status)
            for s, v, status in db.rows(
                "SELECT session_id, version, status FROM agent_sessions_consolidation"
            )
            if _id(s) in closed
        ]
        pending = sum(1 for *_, status in done if status != "done")
        if (len(done) >= len(closed) and not pending) or time.monotonic() > deadline:
            break
        time.sleep(2)
    per_session = Counter(s for s, _, _ in done)
    exact = all(per_session[s] == 1 and (s, v, "done") in done for s, v in closed.items())
    checks.append(
        (
            "closed sessions consolidated once",
            f"{len(closed)} closed: {len(done)} consolidations, {pending} not done",
            exact,
        )
    )
    return checks


# Run -----------------------------------------------------------------------------------------


def prepare(config: str, args: argparse.Namespace, data_dir: Path) -> dict[str, str]:
    env = _env_without_foreign()
    env.update(
        FERRUM_DATA_DIR=str(data_dir),
        DJANGO_SECRET_KEY="soak",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("DATABASE_URL", None)
    env.pop("SQLITE_PATH", None)
    if config == "postgres":
        import psycopg
        import redis

        with psycopg.connect(f"{PG_SERVER} dbname=postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {args.database}")
        redis.Redis.from_url(args.redis_url).flushdb()
        env.update(
            DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{args.database}",
            REDIS_URL=args.redis_url,
        )
    _manage(env, "migrate", "--noinput")
    _manage(env, "init_broker")
    return env


def soak(config: str, args: argparse.Namespace) -> bool:
    turns, questions = locomo_texts()
    texts = list(dict.fromkeys(t for t in turns if len(t) > 60))
    with tempfile.TemporaryDirectory(prefix=f"ferrum-soak-{config}-") as tmp:
        folder = Path(tmp)
        env = prepare(config, args, folder)
        key = _manage(env, "create_api_key", "soak").strip()
        db = Database(
            args.database if config == "postgres" else None,
            folder / "ferrum_memory.sqlite3",
        )
        redis_url = args.redis_url if config == "postgres" else ""
        samples = Samples()
        with ExitStack() as stack:
            svc = stack.enter_context(service(env, folder))
            pacer = Pacer(args.rate)
            share = len(texts) // args.clients
            clients = [
                SoakClient(
                    i, pacer, svc.port, key, texts[i * share : (i + 1) * share], questions, args
                )
                for i in range(args.clients)
            ]
            ledgers: list[Ledger] = []
            # Samples start after the warm-up: the models loading and the first indexes being
            # built are a step at the start, not a trend.
            start = time.monotonic() + args.warmup_minutes * 60
            deadline = start + args.minutes * 60
            threads = [
                threading.Thread(target=lambda c=c: ledgers.append(c.run(deadline)), daemon=True)
                for c in clients
            ]
            for thread in threads:
                thread.start()
            time.sleep(max(0.0, start - time.monotonic()))
            next_sample = start
            while time.monotonic() < deadline + 1:
                if time.monotonic() >= next_sample:
                    sample(svc, db, redis_url, samples, (time.monotonic() - start) / 60)
                    next_sample += args.sample_seconds
                time.sleep(0.5)
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - start + args.warmup_minutes * 60
            ledger = SoakLedger()
            for one in ledgers:
                ledger.merge(one)
            checks = verify(ledger, db, svc.port, key)
            if config == "embedded":
                integrity = db.rows("PRAGMA integrity_check")[0][0]
                checks.append(("SQLite integrity_check", integrity, integrity == "ok"))
            report(config, args, samples, ledger, checks, elapsed)
            if args.json:
                with Path(args.json).open("a") as out:
                    out.write(
                        json.dumps(
                            {
                                "config": config,
                                "minutes": samples.minutes,
                                "series": samples.series,
                                "loads": samples.loads,
                            }
                        )
                        + "\n"
                    )
    return all(ok for *_, ok in checks)


def report(
    config: str,
    args: argparse.Namespace,
    samples: Samples,
    ledger: Ledger,
    checks: list[tuple[str, str, bool]],
    elapsed: float,
) -> None:
    total = sum(len(v) for v in ledger.latencies.values())
    what = (
        "embedded (SQLite, SQLite broker, qdrant-edge)"
        if config == "embedded"
        else f"PostgreSQL {args.database} + Redis {args.redis_url}"
    )
    print(
        f"\n## soak, {what}: {elapsed / 60:.1f} min ({args.warmup_minutes:g} of warm-up, then "
        f"{len(samples.minutes)} samples every {args.sample_seconds:g} s), {args.clients} "
        f"clients paced at {args.rate:g} requests/s ({total:,} requests, "
        f"{total / elapsed:.1f}/s); gunicorn as deployed, Celery worker (prefork, 2), beat\n"
    )
    rows = []
    for name, values in samples.series.items():
        seen = [v for v in values if v is not None]
        slope = slope_per_hour(samples.minutes, values)
        # A leak keeps its slope; a warm-up or a one-off step leaves the second half flat.
        half = len(values) // 2
        late = slope_per_hour(samples.minutes[half:], values[half:])
        role = name.rsplit(" ", 2)[0] if name.endswith(("RSS MB", "anon MB", " fds")) else ""
        restarts = len(samples.pids.get(role, ())) - 1 if role else 0
        rows.append(
            (
                name + (f" ({restarts} restarts)" if restarts > 0 else ""),
                f"{seen[0]:.1f}",
                f"{seen[-1]:.1f}",
                f"{min(seen):.1f}",
                f"{max(seen):.1f}",
                "-" if slope is None else f"{slope:+.1f}",
                "-" if slope is None or not seen[0] else f"{100 * slope / seen[0]:+.1f}%",
                "-" if late is None else f"{late:+.1f}",
            )
        )
    _print_table(
        ("series", "first", "last", "min", "max", "slope/h", "slope/h / first", "2nd half slope/h"),
        rows,
    )
    print()
    by_op = []
    for op, times in sorted(ledger.latencies.items()):
        classes: Counter[int] = Counter()
        for (name, status), n in ledger.statuses.items():
            if name == op:
                classes[status // 100] += n
        p50, p95 = np.percentile(times, [50, 95]) * 1000
        counts = (f"{classes[c]:,}" for c in (2, 4, 5))
        by_op.append((op, f"{len(times):,}", f"{p50:.0f}", f"{p95:.0f}", *counts))
    _print_table(("operation", "requests", "p50 ms", "p95 ms", "2xx", "4xx", "5xx"), by_op)
    print()
    _print_table(
        ("check", "found", "passed"),
        [(name, found, "yes" if ok else "**NO**") for name, found, ok in checks],
    )
    for error in ledger.server_errors:
        print(f"  {error}")
    loads = samples.loads
    print(
        f"\nload average (1 min) at the samples: first {loads[0]:.2f}, mean "
        f"{sum(loads) / len(loads):.2f}, max {max(loads):.2f}, last {loads[-1]:.2f} "
        f"({os.cpu_count()} CPUs, shared with every other program)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--config", nargs="+", choices=("embedded", "postgres"), default=["embedded", "postgres"]
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="of load, per config")
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s, all clients")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument(
        "--warmup-minutes", type=float, default=2.0, help="of load before the first sample"
    )
    parser.add_argument("--ingest-batch", type=int, default=5, help="experiences per POST")
    parser.add_argument(
        "--retry-share", type=float, default=0.1, help="share of ingest POSTs sent twice at once"
    )
    parser.add_argument("--database", default="ferrum_soak", help="PostgreSQL: dropped, created")
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/3", help="a Redis database of its own"
    )
    parser.add_argument("--json", help="append each config's samples to this file (JSON lines)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    random.seed(args.seed)
    print(f"# bench/soak.py, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = [soak(config, args) for config in args.config]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
