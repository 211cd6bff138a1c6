"""What a client sees: ``python bench/web.py [--part web servers replay] [--sizes 10000 100000]``.

- ``web``: each operation over HTTP through gunicorn as deployed (``tests/api/live_server.py``:
  the embedded defaults, 2 workers x 4 threads, keep-alive connections; the vector index in
  ``--index-servers`` processes of ``manage.py memory_index_server``, 2 as the Procfile's, or
  with 0 a copy in each web worker), with 1 and with 4 clients, beside the same operation in
  this process through Django's test client (no socket, no gunicorn; it asks the same index
  servers), and a breakdown of where one in-process request's CPU goes (pyinstrument,
  every sample charged to one part: authentication, throttle, catch-up, embedding, index,
  database, rendering, logging and metrics middleware, the rest of Django and DRF). Operations:
  a trivial authenticated request (GET /memory/{unknown id}: 404), POST /memory/search
  (hybrid, limit 10), POST /memory/context, POST /memory/store of one item and of 256. Memory
  items are LoCoMo turns (numbered to be distinct) with random unit vectors, written straight
  to the DB as bench/search.py does; queries and stored texts are real LoCoMo text, embedded
  per request.
- ``servers``: what asking the index servers costs a search, in this process, alternating
  between an index of its own and the servers on the same data.
- ``replay``: replay of 256 at 10^6 rows on PostgreSQL (bench/replay.py's http part).
  (The stall while the index builds is bench/indexing.py's.)

Every figure of one table comes from one run; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrieval import _print_table, setup_django  # noqa: E402 - after the path set-up
from search import load_items, locomo_texts  # noqa: E402

READER = "bench"  # the agent searched
WRITER = "bench-writer"  # the agent stores go to (its items never enter the searched pool)
SESSION_TURNS = 20
WARMUP = 3
# The targets of issue 17, checked here, never in a timed test.
TARGETS = {
    ("trivial", 1): ("p50", 2.0),
    ("search", 1): ("p50", 10.0),
}
SEARCH_P95_TARGET_MS = 15.0
SEARCH_RATE_TARGET = 150.0

# Where a profiled request's time goes: a sample belongs to the outermost frame that names a
# step (so authentication includes its query) or else the innermost that names a layer.
STEPS = (
    ("authentication", "ferrum_memory/core/authentication.py"),
    ("throttle", "ferrum_memory/core/throttling.py"),
    ("catch-up", "_catch_up"),
    ("embedding", "memory/embeddings.py"),
    ("rendering", "renderers.py"),
    ("parsing", "parsers.py"),
)
LAYERS = (
    ("index", "memory/vector_index.py"),
    ("index", "memory/index_server.py"),  # asking an index server, and waiting for it
    ("database", "django/db/"),
)
# Logging and metrics code is charged its own frames, without what runs inside them: the
# telemetry middleware and the `traced` wrappers hold the whole request or call.
LOGGING_AND_METRICS = (
    "ferrum_memory/core/telemetry.py",
    "ferrum_memory/core/logs.py",
    "ferrum_memory/core/metrics.py",
    "django_prometheus/",
    "prometheus_client/",
    "logging/",
    "pythonjsonlogger/",
    "opentelemetry/",
)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Operation:
    """One kind of request: its method, path and a body for the i-th call."""

    def __init__(self, name: str, method: str, path: Callable[[int], str], body: Any) -> None:
        self.name, self.method, self.path, self.body = name, method, path, body

    def args(self, i: int) -> tuple[str, str, Any]:
        body = self.body(i) if callable(self.body) else self.body
        return self.method, self.path(i), body


def operations(questions: list[str], turns: list[str], session_id: str) -> list[Operation]:
    # Stored texts are distinct across runs and calls, so none is merged as a duplicate.
    run = uuid.uuid4().hex[:8]

    def store(count: int) -> Callable[[int], Any]:
        def body(i: int) -> Any:
            items = [
                {
                    "agent_id": WRITER,
                    "content": f"{turns[(i * count + j) % len(turns)]} {run}-{i}-{j}",
                }
                for j in range(count)
            ]
            return items[0] if count == 1 else items

        return body

    return [
        Operation("trivial", "GET", lambda i: f"/memory/{uuid.uuid4()}", None),
        Operation(
            "search",
            "POST",
            lambda i: "/memory/search",
            lambda i: {"agent_id": READER, "query": questions[i % len(questions)], "limit": 10},
        ),
        Operation(
            "context",
            "POST",
            lambda i: "/memory/context",
            lambda i: {
                "agent_id": READER,
                "query": questions[i % len(questions)],
                "token_budget": 2_000,
                "session_id": session_id,
            },
        ),
        Operation("store 1", "POST", lambda i: "/memory/store", store(1)),
        Operation("store 256", "POST", lambda i: "/memory/store", store(256)),
    ]


def _expect(status: int, op: Operation) -> None:
    wanted = 404 if op.name == "trivial" else (201 if op.name.startswith("store") else 200)
    if status != wanted:
        raise RuntimeError(f"{op.name}: answered {status}, not {wanted}")


def time_http(
    base_url: str, key: str, op: Operation, clients: int, count: int
) -> tuple[list[float], float]:
    """Each request's ms and the requests per second in all, `clients` keep-alive clients
    (each also sends WARMUP requests first, untimed)."""
    import httpx

    times: list[float] = []
    lock = threading.Lock()
    counter = iter(range(10**9))

    def client() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=600) as http:
            for _ in range(WARMUP):  # warm-up: the connection, the worker's first request
                method, path, body = op.args(next(counter))
                http.request(method, path, json=body)
            while True:
                with lock:
                    if len(times) >= count:
                        return
                method, path, body = op.args(next(counter))
                begin = time.perf_counter()
                answer = http.request(method, path, json=body)
                elapsed = (time.perf_counter() - begin) * 1e3
                _expect(answer.status_code, op)
                with lock:
                    times.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times, len(times) / (time.perf_counter() - begin)


def in_process(
    key: str, op: Operation, count: int, profile: bool
) -> tuple[list[float], dict[str, float]]:
    """Each request's ms through Django's test client, and (profiled) ms per part per request."""
    from django.test import Client

    http = Client(headers={"authorization": f"Bearer {key}", "host": "127.0.0.1"})

    def call(i: int) -> None:
        method, path, body = op.args(i)
        if method == "GET":
            answer = http.get(path)
        else:
            answer = http.post(path, data=body, content_type="application/json")
        _expect(answer.status_code, op)

    for i in range(3):
        call(10**6 + i)
    times = []
    for i in range(count):
        begin = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - begin) * 1e3)
    parts: dict[str, float] = {}
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0002)
        with profiler:
            for i in range(count):
                call(2 * 10**6 + i)
        session = profiler.last_session
        assert session is not None
        _charge(session.root_frame(), None, None, parts)
        parts = {name: ms * 1e3 / count for name, ms in parts.items()}
    return times, parts


def _charge(
    frame: Any,
    step: str | None,
    layer: str | None,
    parts: dict[str, float],
    caller_own: str | None = None,
) -> None:
    where = f"{frame.file_path or ''}:{frame.function or ''}"
    if step is None:
        step = next((name for name, mark in STEPS if mark in where), None)
    layer = next((name for name, mark in LAYERS if mark in where), layer)
    if (frame.file_path or "<").startswith("<"):
        own = caller_own  # a built-in, or pyinstrument's [self] time: its caller's part
    else:
        own = "logging and metrics" if any(m in where for m in LOGGING_AND_METRICS) else None
    part = step or own or layer or "Django, DRF and the view"
    parts[part] = parts.get(part, 0.0) + frame.absorbed_time + _self_time(frame)
    for child in frame.children:
        _charge(child, step, layer, parts, own)


def _self_time(frame: Any) -> float:
    return float(frame.time - sum(child.time for child in frame.children))


def _percentiles(times: list[float]) -> tuple[float, float, float]:
    p50, p95, p99 = np.percentile(times, [50, 95, 99])
    return float(p50), float(p95), float(p99)


def build_indexes(folders: int) -> float:
    """Build the index once here and copy its shard folder `folders - 1` times, then let them
    go: each index server (or web worker) takes one and catches up, instead of building the
    index inside its first request (past gunicorn's timeout at 10^5 items). Returns the seconds
    it took."""
    import shutil

    from django.conf import settings
    from search import build_index

    from memory import vector_index

    begin = time.perf_counter()
    build_index()
    index = vector_index._index
    assert index is not None
    index.close()
    vector_index._index = None
    root = Path(settings.DATA_DIR) / "qdrant-edge"
    built = next(p for p in sorted(root.iterdir()) if (p / "state.json").exists())
    for number in range(folders):
        copy = root / f"shard-{number}"
        if copy != built:
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(built, copy, ignore=shutil.ignore_patterns("lock"))
    return time.perf_counter() - begin


# In the environment of the index servers this bench starts: their CPU counts as the servers'.
INDEX_SERVER_MARK = "FERRUM_BENCH_INDEX_SERVER=1"


@contextmanager
def index_servers(count: int) -> Iterator[None]:
    """`manage.py memory_index_server --servers count` on this process's data folder (the
    shard folders `build_indexes` made), until each one listens; always stopped."""
    from memory.index_server import socket_path

    name, value = INDEX_SERVER_MARK.split("=")
    env = {**os.environ, name: value, "VECTOR_INDEX_SERVERS": str(count)}
    command = [sys.executable, "manage.py", "memory_index_server", f"--servers={count}"]
    with open(Path(env["FERRUM_DATA_DIR"]) / "index-servers.log", "ab") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            # Waiting for processes to come up is a loop with a deadline: each loads its shard
            # and catches up before it listens (minutes at 10^5 items on a busy machine).
            deadline = time.monotonic() + 900
            while not all(socket_path(slot).exists() for slot in range(count)):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the index servers did not come up; see {log.name}")
                time.sleep(0.2)
            yield
        finally:
            process.terminate()
            process.wait(timeout=60)


def server_cpu_seconds(port: int) -> float:
    """CPU seconds so far of the gunicorn processes serving `port` (master and workers),
    found by the GUNICORN_BIND in their environment, and of the index servers (only one
    server is measured at a time): a figure the load of other processes hardly moves, unlike
    latency."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    marks = (f"GUNICORN_BIND=127.0.0.1:{port}".encode(), INDEX_SERVER_MARK.encode())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not any(mark in marks for mark in (proc / "environ").read_bytes().split(b"\0")):
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


ROUNDS = 4  # with --baseline, each row alternates between the two servers in this many rounds


def part_web(args: argparse.Namespace, data_dir: str) -> None:
    from django.conf import settings

    from ferrum_memory.core.services import api_key_create
    from memory.vector_index import reset_vector_index
    from sessions.services import session_start
    from tests.api.live_server import live_server_of

    turns, questions = locomo_texts()
    workers = 2
    # The servers compared: this tree's, and a baseline checkout's on the same data.
    roots = {"this": ROOT, **({"baseline": Path(args.baseline)} if args.baseline else {})}
    for size in args.sizes:
        fill = load_items(size, [READER], turns, seed=size)
        session, _ = session_start(
            agent_id=READER,
            fields={},
            messages=[
                {"role": "user" if i % 2 else "assistant", "content": turns[i]}
                for i in range(SESSION_TURNS)
            ],
        )
        ops = [op for op in operations(questions, turns, str(session.id)) if op.name in args.ops]
        # With index servers, they alone hold shards; else each web worker holds one.
        folders = args.index_servers or workers * len(roots)
        built = build_indexes(folders)
        print(
            f"  {size:,} items: filled in {fill:.0f} s, {folders} index folders "
            f"built in {built:.0f} s",
            file=sys.stderr,
        )
        reset_vector_index()
        with ExitStack() as indexes:
            if args.index_servers:
                indexes.enter_context(index_servers(args.index_servers))
                settings.VECTOR_INDEX_SERVERS = args.index_servers  # the in-process runs ask them
            http_rows: dict[tuple[str, str, int], tuple[list[float], float, float]] = {}
            for name in roots:  # manage.py, run before gunicorn makes it, needs it too
                (Path(data_dir) / f"prometheus-{name}").mkdir(exist_ok=True)
            with ExitStack() as stack:
                servers = {
                    name: stack.enter_context(
                        live_server_of(
                            root,
                            Path(data_dir),
                            WEB_CONCURRENCY=str(workers),
                            VECTOR_INDEX_SERVERS=str(args.index_servers),
                            PROMETHEUS_MULTIPROC_DIR=str(Path(data_dir) / f"prometheus-{name}"),
                        )
                    )
                    for name, root in roots.items()
                }
                ports = {
                    name: int(server.base_url.rsplit(":", 1)[1]) for name, server in servers.items()
                }
                for op in ops:
                    for clients in (1, 4):
                        count = args.requests // (8 if op.name == "store 256" else 1)
                        rounds = ROUNDS if len(servers) > 1 else 1
                        got: dict[str, tuple[list[float], float, float, int]] = {
                            name: ([], 0.0, 0.0, 0) for name in servers
                        }
                        for _ in range(rounds):
                            for name, server in servers.items():
                                cpu = server_cpu_seconds(ports[name])
                                begin = time.perf_counter()
                                times, _ = time_http(
                                    server.base_url, server.api_key, op, clients, count // rounds
                                )
                                wall = time.perf_counter() - begin
                                cpu = server_cpu_seconds(ports[name]) - cpu
                                old = got[name]
                                got[name] = (
                                    old[0] + times,
                                    old[1] + wall,
                                    old[2] + cpu,
                                    old[3] + len(times) + WARMUP * clients,
                                )
                        for name, (times, wall, cpu, sent) in got.items():
                            http_rows[name, op.name, clients] = (
                                times,
                                len(times) / wall,
                                cpu * 1e3 / sent,
                            )
                        print(f"  http {op.name} x{clients} done, load {_load()}", file=sys.stderr)
                load_http = _load()
            _, key = api_key_create(name="bench-in-process")
            local: dict[str, tuple[list[float], dict[str, float]]] = {}
            if not args.no_in_process:
                for op in ops:
                    count = args.requests // (8 if op.name == "store 256" else 1)
                    local[op.name] = in_process(key, op, count, profile=True)
            load_local = _load()
            reset_vector_index()
        settings.VECTOR_INDEX_SERVERS = 0
        layout = (
            f"{args.index_servers} index servers"
            if args.index_servers
            else "an index in each web worker"
        )
        print(
            f"\n## {size:,} items of one agent: HTTP through gunicorn ({workers} workers x 4 "
            f"threads, keep-alive, {layout}), load {load_http}; in process (Django test "
            f"client), load {load_local}\n"
        )
        print(
            "server CPU ms/req: CPU time of the gunicorn processes and the index servers per "
            "request sent (warm-ups included), all cores; it moves far less with the machine's "
            "load than latency.\n"
        )
        rows = []
        for op in ops:
            p50_local, p95_local, _ = _percentiles(local[op.name][0]) if local else (0, 0, 0)
            for clients in (1, 4):
                for name in roots:
                    times, rate, cpu_ms = http_rows[name, op.name, clients]
                    p50, p95, p99 = _percentiles(times)
                    first = clients == 1 and name == "this" and bool(local)
                    rows.append(
                        (
                            op.name,
                            name,
                            str(clients),
                            f"{p50:.1f}",
                            f"{p95:.1f}",
                            f"{p99:.1f}",
                            f"{rate:.0f}",
                            f"{cpu_ms:.2f}",
                            f"{p50_local:.1f}" if first else "",
                            f"{p95_local:.1f}" if first else "",
                        )
                    )
        _print_table(
            (
                "operation",
                "server",
                "clients",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "req/s",
                "server CPU ms/req",
                "in-process p50",
                "in-process p95",
            ),
            rows,
        )
        if local:
            names = sorted({part for _, parts in local.values() for part in parts})
            print("\nOne in-process request's time by part (ms, pyinstrument, profiled run):\n")
            _print_table(
                ("part", *(op.name for op in ops)),
                [
                    (name, *(f"{local[op.name][1].get(name, 0.0):.2f}" for op in ops))
                    for name in names
                ]
                + [("total", *(f"{sum(local[op.name][1].values()):.2f}" for op in ops))],
            )
        _print_targets(size, {k[1:]: v[:2] for k, v in http_rows.items() if k[0] == "this"})


def _print_targets(size: int, http_rows: dict[tuple[str, int], tuple[list[float], float]]) -> None:
    """The issue's targets, from this tree's server."""
    checks = []
    if ("trivial", 1) in http_rows:
        trivial = _percentiles(http_rows["trivial", 1][0])
        checks.append(
            ("trivial authenticated request p50, 1 client", trivial[0], "<= 2.0", trivial[0] <= 2.0)
        )
    if ("search", 1) in http_rows:
        search = _percentiles(http_rows["search", 1][0])
        rate = http_rows["search", 4][1]
        checks += [
            (f"search at {size:,} p50, 1 client", search[0], "<= 10.0", search[0] <= 10.0),
            (
                f"search at {size:,} p95, 1 client",
                search[1],
                "<= 15.0",
                search[1] <= SEARCH_P95_TARGET_MS,
            ),
            (f"searches/s at {size:,}, 4 clients", rate, ">= 150", rate >= SEARCH_RATE_TARGET),
        ]
    print()
    _print_table(
        ("target", "measured", "target", "met"),
        [(name, f"{value:.1f}", want, "yes" if ok else "NO") for name, value, want, ok in checks],
    )


def part_servers(args: argparse.Namespace) -> None:
    """What asking the index servers costs a search, in this process, alternating between its
    own index and the servers on the same data: memory_search whole, and the index's hybrid
    call alone (the query embedded beforehand)."""
    from django.conf import settings

    from memory import vector_index
    from memory.embeddings import get_embedder
    from memory.selectors import memory_search

    turns, questions = locomo_texts()
    queries = questions[: args.requests]
    embedder = get_embedder()
    embedded = [(embedder.embed_query(q).tolist(), embedder.sparse_query(q)) for q in queries]
    layouts = {"own index": 0, f"{args.index_servers} index servers": args.index_servers}
    for size in args.sizes:
        load_items(size, [READER], turns, seed=size)
        build_indexes(args.index_servers + 1)  # theirs, and this process's own
        times: dict[tuple[str, str], list[float]] = {}
        with index_servers(args.index_servers):
            for turn in range(ROUNDS):
                # Each round in the other order, so that neither layout always goes first.
                for name, servers in sorted(layouts.items(), reverse=bool(turn % 2)):
                    settings.VECTOR_INDEX_SERVERS = servers
                    vector_index.reset_vector_index()
                    index = vector_index.get_vector_index()
                    memory_search(query=queries[0], agent_id=READER)  # catch-up, warm-up
                    for query, (dense, sparse) in zip(queries, embedded, strict=True):
                        begin = time.perf_counter()
                        memory_search(query=query, agent_id=READER)
                        middle = time.perf_counter()
                        flt = vector_index.SearchFilter(agent_id=READER, now=time.time())
                        index.search(mode="hybrid", dense=dense, sparse=sparse, flt=flt, limit=10)
                        end = time.perf_counter()
                        times.setdefault((name, "memory_search"), []).append(1e3 * (middle - begin))
                        times.setdefault((name, "index call"), []).append(1e3 * (end - middle))
            vector_index.reset_vector_index()
            settings.VECTOR_INDEX_SERVERS = 0
        print(
            f"\n## {size:,} items of one agent, in process: its own index or the index servers, "
            f"alternating ({ROUNDS} rounds of {len(queries)} searches), load {_load()}\n"
        )
        _print_table(
            ("layout", "what", "p50 ms", "p95 ms", "p99 ms"),
            [
                (name, what, *(f"{value:.2f}" for value in _percentiles(values)))
                for (name, what), values in times.items()
            ],
        )


def part_replay(args: argparse.Namespace) -> None:
    """Replay of 256 at 10^6 rows on PostgreSQL: bench/replay.py's http part, its replay rows
    only (each through gunicorn beside the same request in process). Its database is
    FERRUM_BENCH_DB (default ferrum_bench), loaded once by COPY and reused after."""
    import replay  # bench/replay.py

    replay_args = ["--part", "http", "--rows", str(10**6), "--reuse", "--ingest-requests", "0"]
    if os.environ.get("BENCH_REDIS_URL"):
        replay_args += ["--redis-url", os.environ["BENCH_REDIS_URL"]]
    replay.part_http(replay.parse_args(replay_args))


def _run(args: argparse.Namespace, data_dir: str) -> None:
    import subprocess

    try:
        part_web(args, data_dir)
    except subprocess.CalledProcessError as exc:  # a server's set-up command: say why
        print(exc.stderr, file=sys.stderr)
        raise


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["web"], choices=["web", "servers", "replay"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4])
    parser.add_argument("--requests", type=int, default=200)
    names = ("trivial", "search", "context", "store 1", "store 256")
    parser.add_argument("--ops", nargs="+", choices=names, default=list(names))
    parser.add_argument(
        "--baseline",
        help="a checkout of other code (e.g. `git worktree add /tmp/base main`) whose gunicorn "
        "runs beside this tree's on the same data; every HTTP row alternates between the two",
    )
    parser.add_argument(
        "--no-in-process", action="store_true", help="skip the in-process and profiled runs"
    )
    parser.add_argument(
        "--index-servers",
        type=int,
        default=2,
        help="vector index servers, as the Procfile (2); with --baseline both trees' web "
        "workers ask this tree's; 0: each web worker holds a copy of the index",
    )
    args = parser.parse_args(argv)
    if "servers" in args.part and not args.index_servers:
        parser.error("--part servers compares with the index servers: --index-servers 1 or more")
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-http-") as data_dir:
        setup_django(data_dir, keep_near_duplicates=False)
        print(f"# bench/web.py on {platform.node()}, load {_load()}")
        if "web" in args.part:
            _run(args, data_dir)
        if "servers" in args.part:
            part_servers(args)
        if "replay" in args.part:
            part_replay(args)


if __name__ == "__main__":
    main()
