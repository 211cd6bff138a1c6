"""Soak: ``python bench/soak.py [--config embedded postgres] [--minutes 30] [--rate 20]``.

The service as deployed (the Procfile: the vector index servers, gunicorn, a Celery worker
with its prefork pool, beat with the database scheduler), once on the embedded defaults
(SQLite, the SQLite broker, qdrant-edge, working memory in the database) and once on
PostgreSQL + Redis (``--database``, dropped and created; ``--redis-url``, flushed: both the
bench's own). A few client threads send a mixed load at a fixed total rate (``--rate``
requests/s, so the soak measures whether the service stays flat, not how fast it goes):
memories stored, fetched, searched and packed into a context; sessions started, updated and
closed (the worker consolidates them); experiences ingested (a share sent twice at once, as a
client retrying), replayed and their TD errors updated.

By default the data stops growing after the warm-up, through the service's own bounds: each
agent's replay capacity (``--replay-capacity``, its replay settings' max_size, FIFO), so an
ingest evicts the agent's oldest experiences; and a memory TTL (``--memory-ttl``, the
service's DEFAULT_MEMORY_TTL, which the items consolidated from sessions get too), with the
purge scheduled every minute. Resident memory that grows with flat data is a leak; growing
data (``--unbounded``) makes every index grow, and the memory with it.

Every ``--sample-seconds`` (60) it samples, per process: resident memory (VmRSS and its
anonymous part, split into the brk heap and the other anonymous mappings), threads and open
file descriptors, from /proc; the database connections (PostgreSQL:
pg_stat_activity of the bench's database; SQLite: descriptors open on the database file, in
every process of the service); and the data: the rows of each table that grows with the load.
At the end: each series' least-squares slope per hour with its first and last value, the 5xx
count, and a check that every acknowledged write is in the database exactly once, or was
removed by a bound (evicted, expired). Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from load import Ledger, LoadClient, send  # noqa: E402 - after the path set-up
from replay import AGENTS, FOREIGN_ENV, PG_SERVER, _Client, _free_port, _manage  # noqa: E402
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
# The service's gunicorn.conf.py as it is, plus an optional allocation tracer (--tracemalloc).
GUNICORN_ARGS = ("ferrum_memory.wsgi:application", "--config", "bench/soak_gunicorn.py")
BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# With bounded data, the purges run every minute, not every 10 (the defaults, which an
# operator edits in the admin): a store's data then stays within a minute of its bound.
PURGE_SCHEDULES = ("memory: purge expired", "experience: purge expired")
PURGE_EVERY_SECONDS = 60
# Each table that grows with the load: sampled beside the processes, so a reader sees whether
# the data was flat while the memory was.
DATA_TABLES = {
    "memory items": "memory_memoryitem",
    "memory tombstones": "memory_memorytombstone",
    "memory events": "memory_memoryevent",
    "experiences": "experience_experience",
    "experience tombstones": "experience_experiencetombstone",
    "sessions": "agent_sessions_session",
    "consolidations": "agent_sessions_consolidation",
    "working memory rows": "agent_sessions_workingmemoryentry",
}


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
    # Each agent's acknowledged experiences in the order acknowledged: a client is one agent
    # and ingests one batch at a time, so this is the order of their primary keys, which the
    # FIFO eviction follows.
    experience_order: dict[str, list[str]] = field(default_factory=dict)
    # Each acknowledged memory's expires_at as the store answered it (Unix time; None: never).
    memory_expiry: dict[str, float | None] = field(default_factory=dict)
    expired_acks: int = 0  # stores answered with an item expired before the store was sent

    def merge(self, other: Ledger) -> None:
        super().merge(other)
        if isinstance(other, SoakLedger):
            self.td_errors |= other.td_errors
            for agent, ids in other.experience_order.items():
                self.experience_order.setdefault(agent, []).extend(ids)
            self.memory_expiry |= other.memory_expiry
            self.expired_acks += other.expired_acks


def _epoch(value: Any) -> float | None:
    """A timestamp from the API or either database as Unix time (SQLite's are naive UTC)."""
    if value is None:
        return None
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


class SoakClient(LoadClient):
    """load.py's client (one agent, one keep-alive connection, its own session and texts),
    paced, with the operations the soak adds: a memory fetched, a context, TD updates."""

    ledger: SoakLedger

    def __init__(self, number: int, pacer: Pacer, *args: Any) -> None:
        super().__init__(number, *args)
        self.pacer = pacer
        self.ledger = SoakLedger()
        self.memories: dict[str, float | None] = {}  # the live ones: id, expires_at
        self.experiences: list[str] = []  # the newest (the capacity's worth, when bounded)
        self.capacity = self.args.replay_capacity if self.args.bounded else 0

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
        content = self.texts[self.rng.randrange(len(self.texts))]
        sent = time.time()
        status, body = self.call(
            "memory store", "POST", "/memory/store", {"agent_id": self.agent, "content": content}
        )
        if status != 201 or not body:
            return
        point, expires = body["point_id"], _epoch(body["item"]["expires_at"])
        self.ledger.acked_memories.add(point)
        self.ledger.merged_memories += bool(body.get("duplicate"))
        self.ledger.memory_expiry[point] = expires
        # Expired before it was even sent: merged into a dead item (a slow answer may arrive
        # after an item's expiry, which is no fault of the store).
        self.ledger.expired_acks += expires is not None and expires <= sent
        self.memories[point] = expires

    def memory_get(self) -> None:
        now = time.time()
        for point in [p for p, expires in self.memories.items() if expires and expires <= now]:
            del self.memories[point]  # gone by its TTL: a GET would be a 404
        if self.memories:
            point = self.rng.choice(list(self.memories))
            self.call("memory get", "GET", f"/memory/{point}")

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

    def experience_ingest(self) -> list[str]:
        acked = super().experience_ingest()
        self.ledger.experience_order.setdefault(self.agent, []).extend(acked)
        self.experiences += acked
        if self.capacity:  # the rest were evicted: their TD errors cannot be updated
            del self.experiences[: -self.capacity]
        return acked

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


def _anon_split_kb(pid: int) -> tuple[int, int]:
    """A process's anonymous memory in two: the brk heap ([heap]: the main thread's malloc
    arena) and every other anonymous mapping (mmap'd arenas of other threads, large blocks,
    thread stacks, a native library's own allocations). Where a growth lives says whose it is."""
    heap = other = 0
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        first = line.split(maxsplit=6)
        if not first[0].endswith(":"):  # a mapping's header: range, perms, offset, dev, inode
            name = first[5] if len(first) > 5 else ""
        elif first[0] == "Anonymous:":
            kb = int(first[1])
            if name == "[heap]":
                heap += kb
            else:
                other += kb
    return heap, other


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
    """The processes of the Procfile, each started as deployed."""

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
def service(env: dict[str, str], folder: Path, index_servers: int) -> Iterator[Service]:
    """The index servers (unless `index_servers` is 0), gunicorn, the Celery worker and beat
    as the Procfile starts them; always stopped."""
    port = _free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    celery = [sys.executable, "-m", "celery", "-A", "ferrum_memory"]
    name = f"soak-{os.getpid()}@%h"
    # The servers as the Procfile runs them, each one traced (--tracemalloc).
    manage = "bench/soak_index.py" if env.get("SOAK_TRACEMALLOC_DIR") else "manage.py"
    index = [sys.executable, manage, "memory_index_server", f"--servers={index_servers}"]
    commands = {
        **({"index": index} if index_servers else {}),
        # Its default control socket is one per user ($HOME/.gunicorn): leave it to others.
        "gunicorn": [gunicorn, *GUNICORN_ARGS, "--no-control-socket"],
        "worker": [
            # The service's app as `celery -A` runs it, its pool processes traced (--tracemalloc).
            *(
                [sys.executable, "bench/soak_celery.py"]
                if env.get("SOAK_TRACEMALLOC_DIR")
                else celery
            ),
            "worker",
            "--loglevel=INFO",
            "--concurrency=2",
            f"--hostname={name}",
        ],
        "beat": [*celery, "beat", "--loglevel=INFO", "--scheduler", BEAT_SCHEDULER],
    }
    env = {**env, "VECTOR_INDEX_SERVERS": str(index_servers)}
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


def _redis_figures(redis_url: str) -> tuple[int, int]:
    """Connections on the bench's Redis database but the one asking, and its keys."""
    import redis

    client = redis.Redis.from_url(redis_url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    clients = client.client_list()
    me = client.client_id()
    keys = int(client.dbsize())
    client.close()
    return sum(1 for c in clients if int(c.get("db", -1)) == db and int(c["id"]) != me), keys


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


# The series sampled for each process, by the suffix of their names (the longest first, as one
# ends with another).
PROCESS_SERIES = (" other anon MB", " anon MB", " RSS MB", " heap MB", " fds", " threads")


def sample(svc: Service, db: Database, redis_url: str, samples: Samples, minute: float) -> None:
    values: dict[str, float] = {}
    for role, pid in svc.pids().items():
        try:
            rss = _status_kb(pid, "VmRSS") / 1024
            # The heap alone: the kernel drops and maps back shared-library pages (in VmRSS)
            # as the machine's memory pressure varies, which is no trend of the service's.
            anon = _status_kb(pid, "RssAnon") / 1024
            fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
            heap, other_anon = (kb / 1024 for kb in _anon_split_kb(pid))
            threads = _status_kb(pid, "Threads")
        except FileNotFoundError:
            continue  # exited between the listing and the read
        samples.pids.setdefault(role, set()).add(pid)
        values[f"{role} RSS MB"] = rss
        values[f"{role} anon MB"] = anon
        values[f"{role} fds"] = fds
        values[f"{role} heap MB"] = heap
        values[f"{role} other anon MB"] = other_anon
        values[f"{role} threads"] = threads
    values["database connections"] = db.connections(svc)
    if redis_url:
        values["redis connections"], values["redis keys"] = _redis_figures(redis_url)
    for name, table in DATA_TABLES.items():
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


def experience_check(ledger: SoakLedger, db: Database, capacity: int) -> tuple[str, str, bool]:
    """Each agent's newest `capacity` acknowledged experiences (all, without a capacity) are
    in the database once, at their last acknowledged TD error; the older ones were evicted, as
    many as the agent's removals counter says; nothing is stored without an ack."""
    stored = Counter(r[0] for r in db.rows("SELECT experience_id FROM experience_experience"))
    removals = dict(db.rows("SELECT agent_id, removals FROM experience_replaystate"))
    kept: set[str] = set()
    evicted = miscounted = 0
    for agent, order in ledger.experience_order.items():
        newest = order[-capacity:] if capacity else order
        kept.update(newest)
        evicted += len(order) - len(newest)
        miscounted += removals.get(agent, 0) != len(order) - len(newest)
    missing = len(kept - stored.keys())
    twice = sum(1 for n in stored.values() if n > 1)
    unacked = len((stored.keys() & ledger.sent_experiences) - ledger.acked_experiences)
    stayed = len((ledger.acked_experiences - kept) & stored.keys())  # evicted out of turn
    td = dict(db.rows("SELECT experience_id, td_error FROM experience_experience"))
    updated = {eid: value for eid, value in ledger.td_errors.items() if eid in kept}
    wrong_td = sum(1 for eid, value in updated.items() if td.get(eid) != value)
    return (
        "acknowledged experiences stored once (or evicted, oldest first)",
        f"{len(ledger.acked_experiences):,} acknowledged: {len(kept):,} to keep"
        + (f" (each agent's newest {capacity:,})" if capacity else "")
        + f", {evicted:,} evicted ({miscounted} agents' removals counters off); {missing} "
        f"missing, {twice} twice, {stayed} evicted ones still there, {unacked} stored without "
        f"an ack; {len(updated):,} TD errors updated: {wrong_td} not at their last value",
        missing == twice == unacked == stayed == miscounted == wrong_td == 0,
    )


def memory_check(ledger: SoakLedger, db: Database) -> tuple[str, str, bool]:
    """Every acknowledged memory not expired is in the database; an expired one may be there
    until the purge; no live content twice per agent; no store answered with a dead item."""
    rows = db.rows("SELECT id, agent_id, content_hash, expires_at FROM memory_memoryitem")
    now = time.time()  # after the read: what expired by now may have been purged before it
    items = {_id(r[0]) for r in rows}
    live_rows = [r for r in rows if (e := _epoch(r[3])) is None or e > now]
    doubles = sum(1 for n in Counter((r[1], r[2]) for r in live_rows).values() if n > 1)
    acked = {_id(m): expires for m, expires in ledger.memory_expiry.items()}
    live = {m for m, expires in acked.items() if expires is None or expires > now}
    lost = len(live - items)
    purged = len(acked.keys() - live - items)
    return (
        "acknowledged memories stored once (or expired)",
        f"{len(acked):,} distinct items acknowledged ({ledger.merged_memories} stores merged "
        f"into an existing one): {len(live):,} live, {len(acked) - len(live):,} expired "
        f"({purged:,} purged); {lost} live ones missing, {doubles} live contents twice, "
        f"{ledger.expired_acks} stores answered with an item expired before it was sent",
        lost == doubles == ledger.expired_acks == 0,
    )


def verify(
    ledger: SoakLedger, db: Database, port: int, key: str, capacity: int
) -> list[tuple[str, str, bool]]:
    """The checks; `capacity` is each agent's replay capacity (0: none)."""
    checks: list[tuple[str, str, bool]] = []
    server_errors = sum(n for (_, status), n in ledger.statuses.items() if status >= 500)
    checks.append(("no 5xx", f"{server_errors} responses with a 5xx", server_errors == 0))
    checks.append(experience_check(ledger, db, capacity))
    checks.append(memory_check(ledger, db))

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
    if args.bounded:
        env.update(
            DEFAULT_MEMORY_TTL=str(args.memory_ttl),
            # Deletes leave tombstones for the indexes; kept for the TTL's length, not an hour,
            # they are bounded within the warm-up too.
            REPLAY_TOMBSTONE_RETENTION=str(args.memory_ttl),
        )
    if args.tracemalloc:
        env.update(
            SOAK_TRACEMALLOC_DIR=str(data_dir),
            SOAK_TRACEMALLOC_START=str(args.warmup_minutes * 60),
            SOAK_TRACEMALLOC_EVERY=str(args.sample_seconds * 5),
        )
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
    if args.bounded:  # the schedules migrate created, as an operator edits them in the admin
        _manage(
            env,
            "shell",
            "-c",
            "from django_celery_beat.models import IntervalSchedule, PeriodicTask\n"
            "every, _ = IntervalSchedule.objects.get_or_create("
            f"every={PURGE_EVERY_SECONDS}, period=IntervalSchedule.SECONDS)\n"
            f"assert PeriodicTask.objects.filter(name__in={list(PURGE_SCHEDULES)!r})"
            f".update(interval=every) == {len(PURGE_SCHEDULES)}",
        )
    return env


def bound_replay(port: int, key: str, agents: list[str], capacity: int) -> None:
    """Each client's agent gets its capacity (FIFO) through the API, before its first ingest."""
    client = _Client(port, key)
    for agent in agents:
        body = {"agent_id": agent, "max_size": capacity, "remover": "fifo"}
        status, content = client.send("PUT", "/experience/settings", json.dumps(body).encode())
        if status != 200:
            raise RuntimeError(f"PUT /experience/settings: HTTP {status}: {content[:300]!r}")
    client.close()


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
            svc = stack.enter_context(service(env, folder, args.index_servers))
            pacer = Pacer(args.rate)
            share = len(texts) // args.clients
            clients = [
                SoakClient(
                    i, pacer, svc.port, key, texts[i * share : (i + 1) * share], questions, args
                )
                for i in range(args.clients)
            ]
            if args.bounded:
                bound_replay(svc.port, key, [c.agent for c in clients], args.replay_capacity)
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
            capacity = args.replay_capacity if args.bounded else 0
            checks = verify(ledger, db, svc.port, key, capacity)
            if config == "embedded":
                integrity = db.rows("PRAGMA integrity_check")[0][0]
                checks.append(("SQLite integrity_check", integrity, integrity == "ok"))
            report(config, args, samples, ledger, checks, elapsed)
            if args.tracemalloc:
                Path(args.tracemalloc).mkdir(parents=True, exist_ok=True)
                for found in sorted(folder.glob("*-tracemalloc-*.txt")):
                    shutil.copy(found, Path(args.tracemalloc) / f"{config}-{found.name}")
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
        if args.keep_logs:  # the service has stopped: its logs are complete
            kept = Path(args.keep_logs)
            kept.mkdir(parents=True, exist_ok=True)
            for log in sorted(folder.glob("*.log")):
                shutil.copy(log, kept / f"{config}-{log.name}")
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
    data = (
        f"data bounded: each agent's replay capacity {args.replay_capacity:,} (FIFO), memories "
        f"expire after {args.memory_ttl} s (purged every {PURGE_EVERY_SECONDS} s)"
        if args.bounded
        else "data unbounded: every write kept"
    )
    index = (
        f"{args.index_servers} vector index servers"
        if args.index_servers
        else "an index in each process"
    )
    print(
        f"\n## soak, {what}: {elapsed / 60:.1f} min ({args.warmup_minutes:g} of warm-up, then "
        f"{len(samples.minutes)} samples every {args.sample_seconds:g} s), {args.clients} "
        f"clients paced at {args.rate:g} requests/s ({total:,} requests, "
        f"{total / elapsed:.1f}/s); {index}, gunicorn as deployed, Celery worker (prefork, 2), "
        f"beat; {data}\n"
    )
    rows = []
    for name, values in samples.series.items():
        seen = [v for v in values if v is not None]
        slope = slope_per_hour(samples.minutes, values)
        # A leak keeps its slope; a warm-up or a one-off step leaves the second half flat.
        half = len(values) // 2
        late = slope_per_hour(samples.minutes[half:], values[half:])
        role = next((name.removesuffix(s) for s in PROCESS_SERIES if name.endswith(s)), "")
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
    # The data at each sample beside the load, so a reader sees what the memory grew with.
    sizes = [name for name in (*DATA_TABLES, "redis keys") if name in samples.series]
    _print_table(
        ("minute", "load", *sizes),
        [
            (
                f"{minute:.1f}",
                f"{load:.2f}",
                *(f"{samples.series[name][i] or 0:,.0f}" for name in sizes),
            )
            for i, (minute, load) in enumerate(zip(samples.minutes, samples.loads, strict=True))
        ],
    )
    if args.bounded:
        bound = args.clients * args.replay_capacity
        first = samples.series["experiences"][0] or 0
        print(
            f"\nexperiences at the first sample: {first:,.0f} of the {bound:,} the capacity "
            "keeps" + ("" if first >= bound else " (**not reached**: a longer warm-up)")
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
        "--warmup-minutes",
        type=float,
        default=8.0,
        help="of load before the first sample: bounded, the data must reach its bounds by then",
    )
    parser.add_argument(
        "--unbounded",
        dest="bounded",
        action="store_false",
        help="keep every write: no replay capacity, no memory TTL (the data grows)",
    )
    parser.add_argument(
        "--replay-capacity", type=int, default=1000, help="experiences per agent (bounded)"
    )
    parser.add_argument(
        "--memory-ttl", type=int, default=300, help="seconds a memory lives (bounded)"
    )
    parser.add_argument(
        "--index-servers",
        type=int,
        default=2,
        help="vector index servers, as the Procfile; 0: an index in each web and worker process",
    )
    parser.add_argument(
        "--tracemalloc",
        metavar="DIR",
        help="web workers, pool processes and index servers trace their allocations; each "
        "one's growth since the warm-up "
        "(the largest sites) is copied to DIR (slows the service: not for slopes)",
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
    parser.add_argument(
        "--keep-logs",
        metavar="DIR",
        help="copy the service's logs (web, worker, beat, index servers) to DIR at the end: "
        "the run's folder goes, and a 5xx's cause is in them",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.bounded and args.clients > len(AGENTS):
        parser.error(f"bounded, each client is one agent: at most {len(AGENTS)} clients")
    random.seed(args.seed)
    # Stopped with a SIGTERM (a timeout, a kill), it still stops the service it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"# bench/soak.py, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = [soak(config, args) for config in args.config]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
