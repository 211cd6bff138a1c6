"""Load test: ``python bench/load.py [--duration 60] [--clients 16]``.

The service as deployed scaled out: gunicorn (``--web-workers`` processes x ``--threads``) and a
Celery worker, on a fresh PostgreSQL database ``ferrum_load`` and a Redis database of its own
(``--redis-url``: working memory, the throttle's cache, the broker; flushed at start). Client
threads mix experience ingestion (with client ids; a share of the requests is sent twice at
once, as a client retrying a request still in flight), replay sampling, memory store and
search, and session updates (each client its own session, closed every few updates so the
worker consolidates it). Prints throughput and p50/p95/p99 per operation, then verifies that
every acknowledged write is in the database exactly once and that no request got a 5xx; exits
non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Run as a plain script from anywhere: make the project and the other benches importable.
ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from replay import (  # noqa: E402 - after the path set-up
    AGENTS,
    FOREIGN_ENV,
    PG_SERVER,
    _Client,
    _fake_experiences,
    _gunicorn,
    _manage,
    _print_table,
    _stop,
)
from search import locomo_texts  # noqa: E402

# Operation mix: relative weights of what a client does next.
MIX = {
    "experience ingest": 30,
    "replay sample": 20,
    "memory store": 10,
    "memory search": 15,
    "session update": 25,
}
UPDATES_PER_SESSION = 5  # then the session is closed and the worker consolidates it
PRELOAD_EXPERIENCES = 1000
CONSOLIDATION_WAIT_SECONDS = 180


@dataclass
class Ledger:
    """What one client sent and what the service acknowledged."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    sent_experiences: set[str] = field(default_factory=set)
    acked_experiences: set[str] = field(default_factory=set)
    acked_memories: set[str] = field(default_factory=set)
    merged_memories: int = 0
    open_sessions: dict[str, int] = field(default_factory=dict)  # id: last acknowledged version
    closed_sessions: dict[str, int] = field(default_factory=dict)  # id: version closed at

    def record(self, op: str, seconds: float, status: int, body: bytes) -> None:
        self.latencies[op].append(seconds)
        self.statuses[op, status] += 1
        if status >= 500 and len(self.server_errors) < 5:
            self.server_errors.append(f"{op}: HTTP {status}: {body[:300]!r}")

    def merge(self, other: Ledger) -> None:
        for op, values in other.latencies.items():
            self.latencies[op] += values
        self.statuses.update(other.statuses)
        self.server_errors += other.server_errors[: 5 - len(self.server_errors)]
        self.sent_experiences |= other.sent_experiences
        self.acked_experiences |= other.acked_experiences
        self.acked_memories |= other.acked_memories
        self.merged_memories += other.merged_memories
        self.open_sessions |= other.open_sessions
        self.closed_sessions |= other.closed_sessions


def send(
    http: _Client, ledger: Ledger, op: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """One timed request, recorded in the ledger; returns the status and the JSON body."""
    payload = None if body is None else json.dumps(body).encode()
    start = time.perf_counter()
    status, content = http.send(method, path, payload)
    ledger.record(op, time.perf_counter() - start, status, content)
    return status, json.loads(content) if content.startswith((b"{", b"[")) else None


class LoadClient:
    """One simulated agent: a keep-alive connection, its own session, its own texts."""

    def __init__(
        self,
        number: int,
        port: int,
        key: str,
        texts: list[str],
        questions: list[str],
        args: argparse.Namespace,
    ) -> None:
        self.port, self.key, self.args = port, key, args
        self.rng = random.Random(args.seed * 1000 + number)
        self.np_rng = np.random.default_rng(args.seed * 1000 + number)
        self.agent = AGENTS[number % len(AGENTS)]
        self.texts, self.questions = texts, questions
        self.http = _Client(port, key)
        self.ledger = Ledger()
        self.session = ""
        self.version = 0
        self.updates = 0

    def call(self, op: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return send(self.http, self.ledger, op, method, path, body)

    def run(self, deadline: float) -> Ledger:
        self.start_session()
        ops, weights = list(MIX), list(MIX.values())
        while time.monotonic() < deadline:
            getattr(self, self.rng.choices(ops, weights)[0].replace(" ", "_"))()
        self.http.close()
        return self.ledger

    # Operations --------------------------------------------------------------------------

    def experience_ingest(self) -> list[str]:
        """Returns the ids acknowledged, in the order sent (none when the POST failed)."""
        body = list(_fake_experiences(self.np_rng, self.args.ingest_batch, with_td=True))
        for item in body:
            item["agent_id"] = self.agent
        order = [item["id"] for item in body]
        ids = set(order)
        self.ledger.sent_experiences |= ids
        if self.rng.random() >= self.args.retry_share:
            status, _ = self.call("experience ingest", "POST", "/experience/", body)
            if status in (200, 201):
                self.ledger.acked_experiences |= ids
                return order
            return []
        # A retry while the first attempt is still in flight: the same ids, twice, at once.
        op = "experience ingest (retried)"
        other, other_ledger = _Client(self.port, self.key), Ledger()
        retry = threading.Thread(
            target=send, args=(other, other_ledger, op, "POST", "/experience/", body)
        )
        retry.start()
        status, _ = self.call(op, "POST", "/experience/", body)
        retry.join()
        other.close()
        self.ledger.merge(other_ledger)
        if status in (200, 201) or other_ledger.statuses[op, 201] or other_ledger.statuses[op, 200]:
            self.ledger.acked_experiences |= ids
            return order
        return []

    def replay_sample(self) -> None:
        strategy = self.rng.choices(["prioritized", "uniform", "recency"], [70, 15, 15])[0]
        agent = f"&agent_id={self.agent}" if self.rng.random() < 0.5 else ""
        self.call(
            "replay sample", "GET", f"/experience/replay?batch_size=32&strategy={strategy}{agent}"
        )

    def memory_store(self) -> None:
        content = self.texts[self.rng.randrange(len(self.texts))]
        status, body = self.call(
            "memory store", "POST", "/memory/store", {"agent_id": self.agent, "content": content}
        )
        if status == 201 and body:
            self.ledger.acked_memories.add(body["point_id"])
            self.ledger.merged_memories += bool(body.get("duplicate"))

    def memory_search(self) -> None:
        query = self.questions[self.rng.randrange(len(self.questions))]
        self.call(
            "memory search", "POST", "/memory/search", {"agent_id": self.agent, "query": query}
        )

    def session_update(self) -> None:
        if self.updates >= UPDATES_PER_SESSION:
            status, _ = self.call(
                "session close", "POST", "/session/close", {"session_id": self.session}
            )
            if status == 202:
                self.ledger.closed_sessions[self.session] = self.version
                del self.ledger.open_sessions[self.session]
            self.start_session()
            return
        text = self.texts[self.rng.randrange(len(self.texts))]
        status, body = self.call(
            "session update",
            "PUT",
            f"/session/{self.session}",
            {
                "version": self.version,
                "append_messages": [{"role": "user", "content": text}],
                "scratchpad": f"step {self.updates}",
            },
        )
        if status == 200 and body:
            self.version = body["version"]
            self.ledger.open_sessions[self.session] = self.version
        self.updates += 1

    def start_session(self) -> None:
        status, body = self.call(
            "session start", "POST", "/session/start", {"agent_id": self.agent, "task": "load"}
        )
        if status == 201 and body:
            self.session, self.version, self.updates = body["session_id"], body["version"], 0
            self.ledger.open_sessions[self.session] = self.version


# Setup ---------------------------------------------------------------------------------------


def prepare(env: dict[str, str], database: str, redis_url: str) -> str:
    """A fresh, migrated database and an empty Redis database; returns an API key."""
    import psycopg
    import redis

    with psycopg.connect(f"{PG_SERVER} dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {database}")
    redis.Redis.from_url(redis_url).flushdb()
    _manage(env, "migrate", "--noinput")
    return _manage(env, "create_api_key", "load").strip()


@contextmanager
def celery_worker(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "celery", "-A", "ferrum_memory", "worker", "--pool=solo"]
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [*command, "--loglevel=INFO"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    try:
        yield worker
    finally:
        _stop(worker, timeout=30)


def warm_up(port: int, key: str, workers: int, texts: list[str]) -> None:
    """Load the embedding model and build the replay index in every web process, untimed."""
    client = _Client(port, key)
    body = list(_fake_experiences(np.random.default_rng(0), PRELOAD_EXPERIENCES, with_td=True))
    status, content = client.send("POST", "/experience/", json.dumps(body).encode())
    assert status == 201, content[:300]
    client.close()

    def warm(i: int) -> None:
        http = _Client(port, key)
        query = json.dumps({"agent_id": AGENTS[0], "query": texts[i]}).encode()
        for method, path, payload in (
            ("POST", "/memory/search", query),
            ("GET", "/experience/replay?batch_size=32", None),
        ):
            status, content = http.send(method, path, payload)
            assert status == 200, content[:300]
        http.close()

    threads = [threading.Thread(target=warm, args=(i,)) for i in range(workers * 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# Verification --------------------------------------------------------------------------------


def verify(ledger: Ledger, conn: Any, port: int, key: str) -> list[tuple[str, str, bool]]:
    """(check, what was found, passed) for every guarantee the run must keep."""
    checks: list[tuple[str, str, bool]] = []
    server_errors = sum(n for (_, status), n in ledger.statuses.items() if status >= 500)
    checks.append(("no 5xx", f"{server_errors} responses with a 5xx", server_errors == 0))

    sent = sorted(ledger.sent_experiences)
    rows = dict(
        conn.execute(
            "SELECT experience_id, count(*) FROM experience_experience "
            "WHERE experience_id = ANY(%s) GROUP BY experience_id",
            (sent,),
        ).fetchall()
    )
    missing = len(ledger.acked_experiences - rows.keys())
    twice = sum(1 for n in rows.values() if n > 1)
    checks.append(
        (
            "acknowledged experiences stored once",
            f"{len(ledger.acked_experiences):,} acknowledged: {missing} missing, {twice} twice",
            missing == 0 and twice == 0,
        )
    )
    unacked = len(rows.keys() - ledger.acked_experiences)
    checks.append(("experiences stored without an ack", f"{unacked}", unacked == 0))

    acked = sorted(ledger.acked_memories)
    found = conn.execute(
        "SELECT count(*) FROM memory_memoryitem WHERE id::text = ANY(%s)", (acked,)
    ).fetchone()[0]
    doubles = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM memory_memoryitem "
        "GROUP BY agent_id, content_hash HAVING count(*) > 1) AS d"
    ).fetchone()[0]
    checks.append(
        (
            "acknowledged memories stored once",
            f"{len(acked):,} distinct items acknowledged ({ledger.merged_memories} stores merged "
            f"into an existing one): {len(acked) - found} missing, {doubles} contents twice",
            found == len(acked) and doubles == 0,
        )
    )

    client = _Client(port, key)
    wrong = []
    for sid, version in ledger.open_sessions.items():
        status, content = client.send("GET", f"/session/{sid}")
        state = json.loads(content) if status == 200 else {}
        row = conn.execute(
            "SELECT version FROM agent_sessions_session WHERE id = %s", (sid,)
        ).fetchone()
        if state.get("version") != version or row is None or row[0] != version:
            wrong.append(sid)
    client.close()
    checks.append(
        (
            "open sessions at their last acknowledged version",
            f"{len(ledger.open_sessions)} sessions, {len(wrong)} wrong (store and DB)",
            not wrong,
        )
    )

    closed = list(ledger.closed_sessions)
    deadline = time.monotonic() + CONSOLIDATION_WAIT_SECONDS
    while True:  # the worker consolidates what was closed during the run
        consolidations = conn.execute(
            "SELECT session_id::text, version, status FROM agent_sessions_consolidation "
            "WHERE session_id::text = ANY(%s)",
            (closed,),
        ).fetchall()
        pending = sum(1 for *_, status in consolidations if status != "done")
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1)
    per_session = Counter(sid for sid, _, _ in consolidations)
    exact = all(
        per_session[sid] == 1 and (sid, version) in {(s, v) for s, v, _ in consolidations}
        for sid, version in ledger.closed_sessions.items()
    )
    checks.append(
        (
            "closed sessions consolidated once",
            f"{len(closed)} closed: {len(consolidations)} consolidations, {pending} not done",
            exact and pending == 0,
        )
    )
    return checks


# Run -----------------------------------------------------------------------------------------


def percentile_ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.0f}" if values else "-"


def run(args: argparse.Namespace) -> int:
    import psycopg

    turns, questions = locomo_texts()
    texts = list(dict.fromkeys(t for t in turns if len(t) > 60))  # distinct, not "ok!"
    load_at_start = os.getloadavg()[0]
    database_url = f"postgres://postgres@127.0.0.1:5432/{args.database}"
    with tempfile.TemporaryDirectory(prefix="ferrum-load-") as data_dir:
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        env.update(
            DATABASE_URL=database_url,
            REDIS_URL=args.redis_url,
            FERRUM_DATA_DIR=data_dir,
            DJANGO_SECRET_KEY="load",
            HF_HUB_OFFLINE="1",
            API_THROTTLE_RATE="1000000/min",  # measure the service, not the throttle
        )
        key = prepare(env, args.database, args.redis_url)
        folder = Path(data_dir)
        with (
            celery_worker(env, folder / "worker.log"),
            _gunicorn(env, folder / "gunicorn.log", args.web_workers, args.threads) as (port, _),
        ):
            warm_up(port, key, args.web_workers, texts)
            share = len(texts) // args.clients
            clients = [
                LoadClient(i, port, key, texts[i * share : (i + 1) * share], questions, args)
                for i in range(args.clients)
            ]
            ledgers: list[Ledger] = []
            deadline = time.monotonic() + args.duration
            start = time.perf_counter()
            threads = [
                threading.Thread(target=lambda c=c: ledgers.append(c.run(deadline)))
                for c in clients
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - start
            load_at_end = os.getloadavg()[0]
            ledger = Ledger()
            for one in ledgers:
                ledger.merge(one)
            with psycopg.connect(f"{PG_SERVER} dbname={args.database}", autocommit=True) as conn:
                checks = verify(ledger, conn, port, key)

    print(
        f"\n## load: {args.clients} clients for {elapsed:.0f} s; gunicorn {args.web_workers} "
        f"processes x {args.threads} threads, 1 Celery worker (solo); PostgreSQL "
        f"{args.database}, Redis {args.redis_url}; experience batches of {args.ingest_batch}, "
        f"{args.retry_share:.0%} sent twice at once\n"
    )
    rows = []
    for op in [*MIX, "experience ingest (retried)", "session start", "session close"]:
        values = ledger.latencies.get(op, [])
        by_class: Counter[int] = Counter()
        for (name, status), n in ledger.statuses.items():
            if name == op:
                by_class[status // 100] += n
        rows.append(
            (
                op,
                f"{len(values):,}",
                f"{len(values) / elapsed:.1f}",
                percentile_ms(values, 50),
                percentile_ms(values, 95),
                percentile_ms(values, 99),
                f"{by_class[2]:,}",
                f"{by_class[4]:,}",
                f"{by_class[5]:,}",
            )
        )
    total = sum(len(v) for v in ledger.latencies.values())
    rows.append(("all", f"{total:,}", f"{total / elapsed:.1f}", "", "", "", "", "", ""))
    _print_table(
        ("operation", "requests", "per s", "p50 ms", "p95 ms", "p99 ms", "2xx", "4xx", "5xx"),
        rows,
    )
    print()
    _print_table(
        ("check", "found", "passed"),
        [(name, found, "yes" if ok else "**NO**") for name, found, ok in checks],
    )
    for error in ledger.server_errors:
        print(f"  {error}")
    print(
        f"\nload average (1 min): {load_at_start:.1f} at start, {load_at_end:.1f} at the end of "
        f"the run ({os.cpu_count()} CPUs, shared with the clients and every other program)"
    )
    return 0 if all(ok for *_, ok in checks) else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn process")
    parser.add_argument("--ingest-batch", type=int, default=10, help="experiences per POST")
    parser.add_argument(
        "--retry-share", type=float, default=0.1, help="share of ingest POSTs sent twice at once"
    )
    parser.add_argument("--database", default="ferrum_load", help="dropped and created")
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/3", help="a Redis database of its own"
    )
    parser.add_argument("--seed", type=int, default=0)
    sys.exit(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
