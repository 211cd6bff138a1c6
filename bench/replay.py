"""Replay benchmark: ``python bench/replay.py [--part tree http ...]``.

Each part is one function that prints one table; ``main`` runs the parts asked for.

- ``tree``: the in-process index alone. For N = 10^4, 10^5, 10^6, the median time to sample a
  batch of 256 and to update 256 priorities, for our numpy ``PriorityIndex``, cpprb's C++
  ``PrioritizedReplayBuffer`` and a naive numpy ``rng.choice`` that renormalises every time.
- ``http``: the whole service. Loads ``--rows`` experiences into a PostgreSQL database
  ``ferrum_bench`` on 127.0.0.1:5432 (COPY; ``--reuse`` keeps a database already loaded),
  starts gunicorn on it, then measures ``GET /experience/replay`` latency and bulk
  ``POST /experience/`` throughput over HTTP. Needs a PostgreSQL server with trust auth for
  the ``postgres`` user; leaves the database in place. ``--redis-url`` runs the service on
  Redis (broker, cache, working memory) as scaled out; by default it uses the embedded broker.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

# Run as a plain script from anywhere: make the project importable.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import http.client  # noqa: E402 - after bench/ left the path

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6  # DESIGN.md defaults


def median_ms(fn: Callable[[int], object], repeats: int, warmup: int = 5) -> float:
    """Median wall time of ``fn(i)`` in ms; ``i`` selects pre-generated input, so input
    generation stays outside the timed region."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(repeats):
        start = time.perf_counter_ns()
        fn(i)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e6


def _tree_rows(n: int, batch: int, repeats: int, seed: int) -> Iterator[tuple[str, float, float]]:
    from experience.sumtree import PriorityIndex, importance_weights

    rng = np.random.default_rng(seed)
    td = rng.exponential(1.0, n)  # |TD error| of the stored items
    keys = np.arange(1, n + 1, dtype=np.int64)  # database primary keys
    # Pre-generated update batches: which items got new TD errors, and the errors.
    slots = rng.integers(0, n, size=(repeats + 10, batch))
    new_td = rng.exponential(1.0, size=(repeats + 10, batch))

    index = PriorityIndex()
    index.build(keys, (td + EPS) ** ALPHA)

    def ours_sample(_: int) -> object:
        # A replay sample needs IS weights too (cpprb computes them), so they are timed here.
        sampled, probs = index.sample(batch, rng)
        return sampled, importance_weights(probs, len(index), BETA, index.min_probability())

    def ours_update(i: int) -> None:
        index.upsert(keys[slots[i]], (new_td[i] + EPS) ** ALPHA)

    yield "PriorityIndex (numpy)", median_ms(ours_sample, repeats), median_ms(ours_update, repeats)

    try:
        from cpprb import PrioritizedReplayBuffer
    except ImportError:
        yield "cpprb: not installed (pip install cpprb)", float("nan"), float("nan")
    else:
        # cpprb raises (|td| + eps) to alpha itself; its buffer needs at least one field.
        buffer = PrioritizedReplayBuffer(n, {"key": {"dtype": np.int64}}, alpha=ALPHA, eps=EPS)
        buffer.add(key=keys, priorities=td)

        def cpprb_sample(_: int) -> object:
            return buffer.sample(batch, beta=BETA)

        def cpprb_update(i: int) -> None:
            buffer.update_priorities(slots[i], new_td[i])

        version = importlib.metadata.version("cpprb")
        label = f"cpprb {version} PrioritizedReplayBuffer"
        yield label, median_ms(cpprb_sample, repeats), median_ms(cpprb_update, repeats)

    p = (td + EPS) ** ALPHA

    def naive_sample(_: int) -> object:
        return rng.choice(n, batch, p=p / p.sum())  # O(N): renormalise on every draw

    def naive_update(i: int) -> None:
        p[slots[i]] = (new_td[i] + EPS) ** ALPHA

    yield (
        "naive numpy rng.choice",
        median_ms(naive_sample, repeats),
        median_ms(naive_update, repeats),
    )


def part_tree(args: argparse.Namespace) -> None:
    """Print the in-process replay index table."""
    print(f"\n## tree: batch {args.batch}, median of {args.repeats} repeats, times in ms\n")
    print(f"| {'N':>9} | {'implementation':<38} | {'sample':>8} | {'update':>8} |")
    print(f"|{'-' * 11}|{'-' * 40}|{'-' * 10}|{'-' * 10}|")
    for n in args.sizes:
        for name, sample_ms, update_ms in _tree_rows(n, args.batch, args.repeats, args.seed):
            print(f"| {n:>9,} | {name:<38} | {sample_ms:>8.3f} | {update_ms:>8.3f} |")
    print(
        "\nsample: ours = keys + probabilities + IS weights; cpprb = indexes + IS weights + the "
        "stored field; naive = indexes only.\nupdate: ours = key lookup + (|td|+eps)^alpha + "
        "tree walk; naive = one array assignment."
    )


# http ------------------------------------------------------------------------------------

# FERRUM_BENCH_DB: another database name, so that two people on one server do not share one.
BENCH_DB = os.environ.get("FERRUM_BENCH_DB", "ferrum_bench")
PG_SERVER = "host=127.0.0.1 port=5432 user=postgres"
BENCH_DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"
AGENTS = [f"agent-{i:02d}" for i in range(10)]
ONE_AGENT = AGENTS[3]
LOADED_REVISION = 1  # every COPY'd row carries it; rows POSTed later get higher revisions
TARGET_REPLAY_P50_MS = 15.0  # the issues' targets (17 for replay), at 10^6 rows, 2 cores
TARGET_INGEST_PER_S = 2000.0
# Variables that would point the service at another stack than the one measured here.
FOREIGN_ENV = (
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_DEBUG",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "QDRANT_URL",
    "PROMETHEUS_MULTIPROC_DIR",
    "SQLITE_PATH",
)
COPY_COLUMNS = (
    "experience_id",
    "agent_id",
    "session_id",
    "task",
    "tool_calls",
    "test_result",
    "passed",
    "reward",
    "td_error",
    "priority",
    "metadata",
    "created_at",
    "expires_at",
    "times_sampled",
    "revision",
)
STEPS_PER_SESSION = 20

# Vocabulary of a coding agent's episodes: the rows should be as long and as nested as real
# ones, since fetching and serialising them is a large part of what a replay request costs.
MODULES = ["parser", "scheduler", "cache", "auth", "billing", "storage", "router", "metrics"]
FUNCS = ["parse_header", "next_run", "evict", "verify_token", "prorate", "flush", "match", "emit"]
SYMPTOMS = [
    "raises KeyError on an empty header",
    "returns stale entries after their expiry",
    "double-counts retries under concurrent writes",
    "drops the last item of a batch of exactly 1000",
    "ignores the timezone of naive datetimes",
    "leaks a file handle when the upstream times out",
]
FIXES = [
    ("items[:-1]", "items"),
    ("key in cache", "cache.get(key) is not None"),
    ("count += 1", "count += attempts"),
    ("dt.replace()", "dt.astimezone(UTC)"),
]
PLANS = [
    ("grep", "run_tests"),
    ("read_file", "edit_file", "run_tests"),
    ("grep", "read_file", "edit_file", "run_tests"),
]  # 2 to 4 tool calls


def _tool_call(
    name: str, mod: str, func: str, fix: tuple[str, str], n: int, ms: float
) -> dict[str, Any]:
    path = f"src/{mod}/{func}.py"
    if name == "grep":
        arguments: dict[str, Any] = {"pattern": f"def {func}", "path": f"src/{mod}"}
        output = f"{path}:{n + 10}: def {func}(self, items, *, now=None):"
    elif name == "read_file":
        arguments = {"path": path, "start": n, "end": n + 40}
        output = (
            f"def {func}(self, items, *, now=None):\n    now = now or clock()\n    return {fix[0]}"
        )
    elif name == "edit_file":
        arguments = {"path": path, "old": f"return {fix[0]}", "new": f"return {fix[1]}"}
        output = "applied 1 edit"
    else:
        arguments = {"cmd": f"pytest tests/{mod}/test_{func}.py -q -x"}
        output = f"{n % 3} failed, {n} passed in {ms / 1000:.2f}s"
    return {
        "name": name,
        "arguments": arguments,
        "output": output,
        "error": None,
        "duration_ms": round(ms, 1),
    }


def _fake_experiences(
    rng: np.random.Generator, count: int, *, with_td: bool
) -> Iterator[dict[str, Any]]:
    """Experience tuples in the API's input shape, like a coding agent's: a ~200-char task,
    2 to 4 tool calls, a test result. Numbers are drawn per call with numpy (fast); only the
    text is assembled per row. Sessions of 20 steps, each session one agent's."""
    sessions = count // STEPS_PER_SESSION + 1
    session_agent = rng.integers(0, len(AGENTS), sessions).tolist()
    session_tag = [uuid.uuid4().hex[:12] for _ in range(sessions)]
    pick = rng.integers(0, 1 << 30, (count, 5)).tolist()
    passed = (rng.random(count) < 0.55).tolist()
    durations = rng.gamma(2.0, 150.0, (count, 4)).tolist()
    reward_noise = rng.normal(0.0, 0.1, count).tolist()
    td = rng.normal(0.0, 0.5, count).tolist()
    has_td = (rng.random(count) < 0.85).tolist()  # the rest has not been replayed yet
    for i in range(count):
        mod_i, func_i, sym_i, fix_i, n = pick[i]
        mod, func = MODULES[mod_i % len(MODULES)], FUNCS[func_i % len(FUNCS)]
        plan = PLANS[fix_i % len(PLANS)]
        fix = FIXES[fix_i % len(FIXES)]
        n = n % 200 + 5
        ok = passed[i]
        session = i // STEPS_PER_SESSION
        item: dict[str, Any] = {
            "id": uuid.uuid4().hex,  # what the API makes when a client sends none
            "agent_id": AGENTS[session_agent[session]],
            "session_id": f"sess-{session_tag[session]}",
            "task": (
                f"Fix the failing test test_{func}_{n} in tests/{mod}/test_{func}.py: "
                f"{func}() {SYMPTOMS[sym_i % len(SYMPTOMS)]}. Keep the public API of {mod} "
                f"unchanged and add a regression test for this edge case."
            ),
            "tool_calls": [
                _tool_call(name, mod, func, fix, n, durations[i][k]) for k, name in enumerate(plan)
            ],
            "test_result": {
                "passed": ok,
                "total": n,
                "failed": 0 if ok else 1 + n % 3,
                "errors": 0,
                "output": f"{n} passed in 0.{n}s" if ok else f"FAILED test_{func}_{n} - {mod}",
                "duration_ms": round(durations[i][0] * 3, 1),
            },
            "reward": round((1.0 if ok else -0.5) + reward_noise[i], 4),
        }
        if with_td:
            item["td_error"] = round(td[i], 6) if has_td[i] else None
        yield item


def _copy_experiences(conn: Any, rows: int, seed: int) -> None:
    """COPY `rows` experiences in one transaction: the fastest honest load (the rows the API
    would store, for several times less CPU than bulk_create); HTTP is measured separately."""
    rng = np.random.default_rng(seed)
    # Spread over the past hour, sorted so ids grow with created_at as when rows arrive.
    created = np.sort(time.time() - rng.uniform(0.0, 3600.0, rows))
    created_at = np.datetime_as_string(
        (created * 1e6).astype("datetime64[us]"), unit="us", timezone="UTC"
    ).tolist()
    sql = f"COPY experience_experience ({', '.join(COPY_COLUMNS)}) FROM STDIN"
    with conn.cursor() as cursor, cursor.copy(sql) as copy:
        for i, item in enumerate(_fake_experiences(rng, rows, with_td=True)):
            td = item["td_error"]
            # As experience.services does under the defaults; no TD error yet: max priority 1.
            priority = 1.0 if td is None else (abs(td) + EPS) ** ALPHA
            result = item["test_result"]
            copy.write_row(
                (
                    item["id"],
                    item["agent_id"],
                    item["session_id"],
                    item["task"],
                    json.dumps(item["tool_calls"]),
                    json.dumps(result),
                    result["passed"],
                    item["reward"],
                    td,
                    priority,
                    "{}",
                    created_at[i],
                    None,
                    0,
                    LOADED_REVISION,
                )
            )  # expires_at NULL: kept forever, so no row expires during the run
            if (i + 1) % 200_000 == 0:
                print(f"  copied {i + 1:,} rows", file=sys.stderr, flush=True)


def _manage(env: dict[str, str], *command: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout


def _scalar(conn: Any, sql: str, params: tuple[object, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def _prepare_database(env: dict[str, str], rows: int, reuse: bool, seed: int) -> str:
    """Create, migrate and load the bench database; return how the rows got there."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER} dbname=postgres", autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,))
        loaded = 0
        if reuse and exists.fetchone():
            with psycopg.connect(f"{PG_SERVER} dbname={BENCH_DB}") as conn:
                if _scalar(conn, "SELECT to_regclass('experience_experience')"):
                    loaded = _scalar(
                        conn,
                        "SELECT count(*) FROM experience_experience WHERE revision = %s",
                        (LOADED_REVISION,),
                    )
        reuse = loaded == rows
        if not reuse:
            admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {BENCH_DB}")
    _manage(env, "migrate", "--noinput")
    start = time.perf_counter()
    with psycopg.connect(f"{PG_SERVER} dbname={BENCH_DB}") as conn:
        if reuse:
            # Rows an earlier run POSTed: every run starts from the same N loaded rows.
            conn.execute(
                "DELETE FROM experience_experience WHERE revision > %s", (LOADED_REVISION,)
            )
        else:
            _copy_experiences(conn, rows, seed)
        # COPY bypasses experience.services, so take the loaded rows' revision by hand: the
        # replay index reads rows up to the counter's value and would see nothing otherwise.
        conn.execute(
            "INSERT INTO core_revisioncounter (name, value, purged_through) "
            "VALUES ('experience', %s, 0) ON CONFLICT (name) DO UPDATE "
            "SET value = GREATEST(core_revisioncounter.value, EXCLUDED.value)",
            (LOADED_REVISION,),
        )
    # COPY bypasses the agents' replay counters too (size, inserts): count them from the rows.
    _manage(
        env,
        "shell",
        "-c",
        "from experience.replay_services import replay_state_recount; replay_state_recount()",
    )
    loaded_in = time.perf_counter() - start
    start = time.perf_counter()
    with psycopg.connect(f"{PG_SERVER} dbname={BENCH_DB}", autocommit=True) as conn:
        # Autovacuum gets there eventually; doing it now gives the planner statistics and the
        # visibility map a service in steady state has, instead of measuring a cold table.
        conn.execute("VACUUM (ANALYZE) experience_experience")
    vacuumed_in = time.perf_counter() - start
    how = "reused" if reuse else f"COPY in {loaded_in:.0f} s"
    return f"{how}, VACUUM ANALYZE in {vacuumed_in:.0f} s"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Client:
    """One keep-alive HTTP connection (http.client: `requests` is not in the venv)."""

    def __init__(self, port: int, key: str) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self._conn.request(method, path, body=body, headers=self._headers)
                response = self._conn.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # gunicorn closes a connection idle for 2 s (keepalive); every request here is
                # idempotent (POSTs carry their ids), so reconnect and send it again.
                self._conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._conn.close()


def _checked(client: _Client, method: str, path: str, body: bytes | None = None) -> bytes:
    status, content = client.send(method, path, body)
    if status not in (200, 201):
        raise RuntimeError(f"{method} {path}: HTTP {status}: {content[:500]!r}")
    return content


@contextlib.contextmanager
def _gunicorn(
    env: dict[str, str], log_path: Path, workers: int = 1, threads: int = 4
) -> Iterator[tuple[int, int]]:
    """Run the web process as deployed, yield its port and pid, and always stop it."""
    port = _free_port()
    server_env = {
        **env,
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        # One process by default: the replay index lives in each process, so it is built once
        # and every request samples the same one. Its threads serve requests concurrently.
        "WEB_CONCURRENCY": str(workers),
        "GUNICORN_THREADS": str(threads),
    }
    gunicorn = Path(sys.executable).parent / "gunicorn"
    command = [str(gunicorn), "ferrum_memory.wsgi:application", "--config", "gunicorn.conf.py"]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=server_env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {server.returncode}")
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                probe.request("GET", "/health")
                if probe.getresponse().status == 200:
                    break
            except OSError:
                pass  # not listening yet
            finally:
                probe.close()
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not answer /health with 200 within 60 s")
            time.sleep(0.2)
        yield port, server.pid
    except BaseException:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print("gunicorn log (tail):", *tail, sep="\n  ", file=sys.stderr)
        raise
    finally:
        _stop(server, timeout=40)


def _stop(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (gunicorn's and Celery's graceful shutdown), then SIGKILL after `timeout`."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _CpuMeter:
    """CPU seconds used by the gunicorn worker and by the PostgreSQL backends serving it.

    Wall times on a shared machine include waiting for other programs; CPU time does not, so
    it tells what a request costs even when the load average is high. Linux /proc only. A
    backend that exits during a measurement (CONN_MAX_AGE is 60 s) takes its CPU time along.
    """

    def __init__(self, gunicorn_pid: int) -> None:
        import psycopg

        self._master = gunicorn_pid
        self._conn = psycopg.connect(f"{PG_SERVER} dbname={BENCH_DB}", autocommit=True)

    @staticmethod
    def _cpu(pid: int) -> float | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return None  # exited since it was listed
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may have spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def snapshot(self) -> dict[str, dict[int, float]]:
        children = Path(f"/proc/{self._master}/task/{self._master}/children").read_text()
        backends = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            (BENCH_DB,),
        ).fetchall()
        groups = {"web": [int(pid) for pid in children.split()], "db": [r[0] for r in backends]}
        return {
            name: {pid: cpu for pid in pids if (cpu := self._cpu(pid)) is not None}
            for name, pids in groups.items()
        }

    @staticmethod
    def used(
        before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
    ) -> tuple[float, float]:
        """CPU seconds of the web worker and of PostgreSQL between two snapshots."""
        web, db = (
            sum(cpu - before[name].get(pid, 0.0) for pid, cpu in after[name].items())
            for name in ("web", "db")
        )
        return web, db

    def close(self) -> None:
        self._conn.close()


def _replay_latency(client: _Client, meter: _CpuMeter, query: str, count: int) -> tuple[float, str]:
    """The p50 in ms of `count` sequential GETs (after 5 unmeasured ones), and a figure with
    p50, p95, the CPU they cost and what the last response held."""
    path = f"/experience/replay?{query}"
    for _ in range(5):
        _checked(client, "GET", path)
    times = []
    before = meter.snapshot()
    for _ in range(count):
        start = time.perf_counter_ns()
        content = _checked(client, "GET", path)
        times.append((time.perf_counter_ns() - start) / 1e6)
    web, db = meter.used(before, meter.snapshot())
    last = json.loads(content)
    p50, p95 = statistics.median(times), statistics.quantiles(times, n=20)[18]
    return p50, (
        f"p50 {p50:.1f} ms, p95 {p95:.1f} ms; CPU/request web {web / count * 1e3:.1f} + "
        f"PostgreSQL {db / count * 1e3:.1f} ms (N {last['buffer_size']:,}, "
        f"{len(last['items'])} items, {len(content) / 1024:.0f} KiB)"
    )


def _ingest_rate(
    port: int, key: str, meter: _CpuMeter, bodies: list[bytes], threads: int
) -> tuple[float, str]:
    """Experiences per second stored by POSTing the pre-encoded `bodies` from `threads`
    keep-alive clients, and a figure with the CPU they cost; checks that all were created."""
    clients = [_Client(port, key) for _ in range(threads)]
    before = meter.snapshot()

    def post_all(worker: int) -> list[bytes]:
        return [
            _checked(clients[worker], "POST", "/experience/", b) for b in bodies[worker::threads]
        ]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        replies = [r for chunk in pool.map(post_all, range(threads)) for r in chunk]
    elapsed = time.perf_counter() - start
    web, db = meter.used(before, meter.snapshot())
    for client in clients:
        client.close()
    created = sum(json.loads(reply)["created"] for reply in replies)
    expected = sum(len(json.loads(body)) for body in bodies)
    if created != expected:
        raise RuntimeError(f"POSTed {expected} new experiences, {created} were created")
    per_1000 = 1e6 / created  # CPU seconds -> ms per 1,000 experiences
    return created / elapsed, (
        f"{created / elapsed:,.0f} experiences/s; CPU per 1,000: web {web * per_1000:.0f} + "
        f"PostgreSQL {db * per_1000:.0f} ms"
    )


def _put_settings(client: _Client, agent_id: str, **values: object) -> dict[str, Any]:
    """PUT an agent's replay settings (each one left out: its default); its answer."""
    body = json.dumps({"agent_id": agent_id, **values}).encode()
    return json.loads(_checked(client, "PUT", "/experience/settings", body))


def _capacity_at_current_size(client: _Client) -> int:
    """Give every agent a capacity equal to its size now, so each insert evicts one item;
    return the total capacity."""
    total = 0
    for agent in AGENTS:
        size = json.loads(_checked(client, "GET", f"/experience/settings?agent_id={agent}"))[
            "limiter"
        ]["size"]
        _put_settings(client, agent, max_size=size)
        total += size
    return total


def _row_count() -> int:
    import psycopg

    with psycopg.connect(f"{PG_SERVER} dbname={BENCH_DB}") as conn:
        return int(_scalar(conn, "SELECT count(*) FROM experience_experience"))


REPLAY_SERIES = [
    ("prioritized, all agents", "strategy=prioritized"),
    (f"prioritized, {ONE_AGENT}", f"strategy=prioritized&agent_id={ONE_AGENT}"),
    (f"uniform, {ONE_AGENT}", f"strategy=uniform&agent_id={ONE_AGENT}"),
    (f"recency, {ONE_AGENT}", f"strategy=recency&agent_id={ONE_AGENT}"),
    (
        f"prioritized alpha=0.3 (exact O(N)), {ONE_AGENT}",
        f"strategy=prioritized&alpha=0.3&agent_id={ONE_AGENT}",
    ),
]


def part_inprocess(args: argparse.Namespace) -> None:
    """The replay series in this process through Django's test client (no socket, no
    gunicorn), on the database the environment names; one JSON line {label: [p50 ms, CPU ms]}.
    Run by part_http in a child process, so the two stacks do not share a process."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")
    django.setup()
    from django.test import Client

    client = Client(
        HTTP_AUTHORIZATION=f"Bearer {os.environ['BENCH_API_KEY']}", HTTP_HOST="localhost"
    )
    figures = {}
    for label, query in REPLAY_SERIES:
        path = f"/experience/replay?{query}&batch_size={args.batch}"

        def get(_: int, path: str = path) -> None:
            response = client.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: {response.status_code} {response.content[:300]!r}")

        get(0)  # the first request of all builds the index: not timed
        cpu = time.process_time()
        p50 = median_ms(get, args.repeats)
        cpu_ms = (
            (time.process_time() - cpu) * 1e3 / (args.repeats + 5)
        )  # with median_ms' 5 warm-ups
        figures[label] = [p50, cpu_ms]
    print(json.dumps(figures))


def _rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def part_scale(args: argparse.Namespace) -> None:
    """Print the replay index's memory at --rows experiences of 10 agents (Linux /proc).

    The trees are built in this process from numpy columns, as ReplayIndex builds them from
    the rows it streams (no database: this is the trees' own memory and build time). The peak
    includes the input columns (36 bytes a row), which a build from PostgreSQL holds too."""
    import resource

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")
    os.environ.setdefault("FERRUM_DATA_DIR", tempfile.mkdtemp(prefix="ferrum-bench-scale-"))
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench")
    django.setup()
    from experience.replay_index import ALL_AGENTS, ReplayIndex

    n, rng = args.rows, np.random.default_rng(args.seed)
    base = _rss_mb()
    created = time.time() - np.sort(rng.uniform(0.0, 3600.0, n))[::-1]
    columns = (
        np.arange(1, n + 1, dtype=np.int64),  # primary keys
        rng.integers(0, len(AGENTS), n).astype(np.int32),  # agent codes
        (rng.exponential(1.0, n) + EPS) ** ALPHA,
        created,
        np.full(n, np.inf),  # never expire
    )
    index = ReplayIndex()
    start = time.perf_counter()
    index._load(*columns, agents=AGENTS, rebuild=True)
    built = time.perf_counter() - start
    del columns, created
    held = _rss_mb() - base
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    tree = index._buffers[ALL_AGENTS]
    keys, _ = tree.items()
    sample = median_ms(lambda _: tree.sample(args.batch, rng), 50)
    picks = rng.integers(0, n, size=(60, args.batch))
    times = {"created": np.full(args.batch, time.time()), "expires": np.full(args.batch, np.inf)}
    update = median_ms(lambda i: tree.upsert(keys[picks[i]], rng.random(args.batch), **times), 50)
    # Recency: the first draw at a half-life weights every item (O(N)), the second builds the
    # buffer's recency tree, later ones draw from it. Each new half-life below is one not
    # asked before.
    recency = partial(
        index._draw, ALL_AGENTS, tree, strategy="recency", rng=rng, exponent=1.0, stratified=False
    )
    fresh = iter(3600.0 + np.arange(1, 1000))
    weighed = median_ms(lambda _: recency(args.batch, half_life=next(fresh)), 20)
    before = _rss_mb()
    start = time.perf_counter()
    recency(args.batch, half_life=3600.0)
    recency(args.batch, half_life=3600.0)
    recency_built = time.perf_counter() - start
    recency_held = _rss_mb() - before
    from_tree = median_ms(lambda _: recency(args.batch, half_life=3600.0), 50)
    print(f"\n## scale: the replay index at {n:,} rows of {len(AGENTS)} agents, load {_load()}\n")
    _print_table(
        ("measurement", "figure"),
        [
            ("trees built (all agents + one per agent)", f"{built:.1f} s"),
            ("resident memory they hold", f"{held:,.0f} MB ({held * 2**20 / n:.0f} bytes a row)"),
            ("peak during the build (with the input columns)", f"{peak:,.0f} MB"),
            ("process resident memory", f"{_rss_mb():,.0f} MB"),
            (f"sample {args.batch} (all agents), median", f"{sample:.3f} ms"),
            (f"update {args.batch} priorities (all agents), median", f"{update:.3f} ms"),
            (f"recency sample {args.batch}, weighing every item, median", f"{weighed:.3f} ms"),
            (
                "recency tree built (a first draw and the one that builds it)",
                f"{recency_built * 1e3:.0f} ms, {recency_held:,.0f} MB",
            ),
            (f"recency sample {args.batch} from its tree, median", f"{from_tree:.3f} ms"),
        ],
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _in_process_figures(env: dict[str, str], key: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--part", "inprocess", "--batch", str(args.batch)]
    command += ["--repeats", str(args.repeats)]
    result = subprocess.run(
        command,
        cwd=ROOT,
        env={**env, "BENCH_API_KEY": key},
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def part_http(args: argparse.Namespace) -> None:
    """Print the HTTP table: replay latency and bulk ingestion through gunicorn + PostgreSQL."""
    wall = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    rows: list[tuple[str, str, str, str]] = []  # measurement, figure, target, met

    def verdict(ok: bool) -> str:
        return "yes" if ok else "**NO**"

    with tempfile.TemporaryDirectory(prefix="ferrum-bench-") as data_dir:
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        env.update(
            DATABASE_URL=BENCH_DATABASE_URL,
            FERRUM_DATA_DIR=data_dir,
            DJANGO_SECRET_KEY="bench",
            API_THROTTLE_RATE="1000000/min",  # measure the service, not the throttle
        )
        if args.redis_url:  # scaled out: Celery broker, cache (throttle) and working memory
            env["REDIS_URL"] = args.redis_url
        how = _prepare_database(env, args.rows, args.reuse, args.seed)
        rows.append(("rows loaded", f"{_row_count():,} ({how})", "", ""))
        key = _manage(env, "create_api_key", "bench", "--rotate").strip()
        # Built before the server starts, so client-side JSON encoding is not timed.
        rng = np.random.default_rng(args.seed + 1)
        bodies = [
            json.dumps(list(_fake_experiences(rng, args.ingest_batch, with_td=False))).encode()
            for _ in range(4 * args.ingest_requests)  # half without a capacity, half at one
        ]
        # In process first (its own child process, before gunicorn starts, so they never
        # share the CPUs): the same requests through Django's test client.
        local = _in_process_figures(env, key, args)
        with _gunicorn(env, Path(data_dir) / "gunicorn.log") as (port, pid):
            client, meter = _Client(port, key), _CpuMeter(pid)
            start = time.perf_counter()
            _checked(client, "GET", f"/experience/replay?batch_size={args.batch}")
            build = time.perf_counter() - start
            rows.append(("index build (first request)", f"{build:.1f} s", "", ""))
            target = f"p50 <= {TARGET_REPLAY_P50_MS:.0f} ms"
            for label, query in REPLAY_SERIES:
                query = f"{query}&batch_size={args.batch}"
                p50, figure = _replay_latency(client, meter, query, args.repeats)
                local_p50, local_cpu = local[label]
                figure += f"; in process p50 {local_p50:.1f} ms, CPU {local_cpu:.1f} ms"
                rows.append(
                    (f"replay {label}", figure, target, verdict(p50 <= TARGET_REPLAY_P50_MS))
                )
            workers = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            resident = ", ".join(f"{_rss_mb(worker):,.0f} MB" for worker in workers)
            rows.append(("web worker resident memory, replay index built", resident, "", ""))
            # The replay controls on ONE_AGENT: the rate limiter at a ratio it never reaches (so
            # every request pays for its grant, one conditional UPDATE, and none is refused),
            # then the sampling cap at a count never reached (each request counts its draws in
            # its own transaction, holding the experience write lock).
            query = f"strategy=prioritized&agent_id={ONE_AGENT}&batch_size={args.batch}"
            for label, values in (
                ("rate limiter on", {"samples_per_insert": 1e6, "spi_tolerance": 1e12}),
                ("sampling cap on", {"max_times_sampled": 10**9}),
            ):
                _put_settings(client, ONE_AGENT, **values)
                p50, figure = _replay_latency(client, meter, query, args.repeats)
                rows.append(
                    (
                        f"replay prioritized, {ONE_AGENT}, {label}",
                        figure,
                        target,
                        verdict(p50 <= TARGET_REPLAY_P50_MS),
                    )
                )
            _put_settings(client, ONE_AGENT)  # the defaults again
            if args.ingest_requests:  # 0: the replay rows only (bench/web.py's replay part)
                n, target = args.ingest_requests, f">= {TARGET_INGEST_PER_S:,.0f} /s"
                chunks = [bodies[i * n : (i + 1) * n] for i in range(4)]
                for threads, chunk in ((1, chunks[0]), (args.clients, chunks[1])):
                    rate, figure = _ingest_rate(port, key, meter, chunk, threads)
                    label = f"ingest {n} x {args.ingest_batch:,}, {threads} client thread(s)"
                    rows.append((label, figure, target, verdict(rate >= TARGET_INGEST_PER_S)))
                # At capacity: each agent's max_size is its size now, so each insert evicts one
                # item (fifo) in its transaction, and the buffer stays the same size.
                capacity = _capacity_at_current_size(client)
                for threads, chunk in ((1, chunks[2]), (args.clients, chunks[3])):
                    rate, figure = _ingest_rate(port, key, meter, chunk, threads)
                    label = (
                        f"ingest {n} x {args.ingest_batch:,} at capacity {capacity:,} (each evicts "
                        f"one), {threads} client thread(s)"
                    )
                    rows.append((label, figure, target, verdict(rate >= TARGET_INGEST_PER_S)))
                rows.append(
                    ("rows at capacity", f"{_row_count():,} (capacity {capacity:,})", "", "")
                )
                for agent in AGENTS:
                    _put_settings(client, agent)
            client.close()
            meter.close()
        if args.ingest_requests:
            rows.append(("rows after ingestion", f"{_row_count():,}", "", ""))
    # Every process on the machine shares its CPUs: a load above the CPU count means the
    # figures above include waiting for another program.
    load = f"{load_at_start:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs)"
    rows.append(("load average (1 min)", load, "", ""))

    stack = f"Redis {args.redis_url}" if args.redis_url else "embedded SQLite broker, file cache"
    print(
        f"\n## http: gunicorn 1 worker process x 4 threads (so the in-process replay index is "
        f"built once), PostgreSQL, {stack}, batch_size {args.batch}, {args.repeats} "
        f"sequential keep-alive GETs per replay row\n"
    )
    _print_table(("measurement", "figure", "target", "met"), rows)
    print(
        "\nCPU: of the gunicorn worker, and of the PostgreSQL client backends serving it "
        "(parallel query workers are not counted); unlike wall time it excludes waiting for "
        "other programs."
    )
    print(f"\nwall time of the http part: {time.perf_counter() - wall:.0f} s")


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """A Markdown table with padded columns, readable as text too."""
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {
    "tree": part_tree,
    "http": part_http,
    "inprocess": part_inprocess,  # run by part_http in a child process
    "scale": part_scale,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--part", nargs="+", choices=sorted(PARTS), default=["tree"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10**4, 10**5, 10**6])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    http_args = parser.add_argument_group("http part")
    http_args.add_argument(
        "--rows", type=int, default=10**6, help="experiences to load (http) or index (scale)"
    )
    http_args.add_argument(
        "--reuse", action="store_true", help="keep ferrum_bench if it holds --rows loaded rows"
    )
    http_args.add_argument("--ingest-requests", type=int, default=20, help="POSTs per ingest row")
    http_args.add_argument("--ingest-batch", type=int, default=1000, help="experiences per POST")
    http_args.add_argument(
        "--clients", type=int, default=4, help="threads of the concurrent ingest"
    )
    http_args.add_argument(
        "--redis-url",
        default="",
        help="REDIS_URL of the service, as scaled out (default: the embedded SQLite broker)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    for part in args.part:
        PARTS[part](args)


if __name__ == "__main__":
    main()
