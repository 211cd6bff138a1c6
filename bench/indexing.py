"""Indexing without stalls, and the index at scale: ``bench/indexing.py [--part stall scale]``.

Through gunicorn as deployed (gunicorn.conf.py: 2 workers x 4 threads, embedded defaults:
SQLite, qdrant-edge), once per index layout (``--layouts``), side by side in one run:

- ``in-process``: VECTOR_INDEX_SERVERS=0, each web process keeps its own index and builds its
  graphs inside the request whose catch-up crosses the optimizer's threshold (before issue 17);
- ``servers``: VECTOR_INDEX_SERVERS=2 and ``manage.py memory_index_server``: two index server
  processes hold the index and build graphs off every request's path (memory.index_server);
- ``1-server`` (not run unless asked): VECTOR_INDEX_SERVERS=1, one index server process.

Parts:

- ``stall`` (issue 17, item 3): one agent ingests ``--items`` items, one item per POST
  /memory/store, from 2 keep-alive clients, while a third client searches another agent of 100
  items (POST /memory/search, hybrid, limit 10) back to back. Stored texts are real: SciFact
  abstract sentences and LoCoMo turns, each distinct (embedded by the service, one per store);
  queries are LoCoMo questions. Prints p50/p95/p99/max of the stores and of the searches, the
  slowest search and when it came, the load average, and each process's resident memory.
  ``--code A B`` runs the service from each checkout in turn, ``--rounds`` times (A B A B).
- ``scale`` (item 4): ``--scale-items`` rows written straight to the DB (see ``fill``: real
  LoCoMo and SciFact texts with their real embeddings, perturbed copies beyond the distinct
  texts), as one agent and as agents of 100; then the rebuild time (the index built from the DB
  until its graphs are done), search p50/p95 over HTTP (1 client, real LoCoMo questions) and
  each process's resident memory (with the servers, a Celery worker's too, once it ran an index
  task). ``--code`` runs the service from other checkouts too (before and after a change).

The API throttle is raised for the run (API_THROTTLE_RATE): the bench measures the index, not
the rate limit. Nothing here is a test: the issue's targets are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent
LAYOUTS = {"in-process": "0", "servers": "2", "1-server": "1"}  # layout: VECTOR_INDEX_SERVERS
SCALED_OUT = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "QDRANT_URL")
WRITER, READER = "ingest", "reader"
READER_ITEMS = 100
# Distinct texts embedded for real (scale fills the rest with perturbed copies of them).
REAL_TEXTS = 6_000
WEB_WORKERS = 2  # gunicorn.conf.py's default
TARGETS = "search p99 <= 50 ms, max <= 150 ms; store p99 <= 300 ms"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# Texts ------------------------------------------------------------------------------------------


def locomo() -> tuple[list[str], list[str]]:
    """(every LoCoMo turn as "speaker: text", every question)."""
    conversations = json.loads((DATA / "locomo" / "locomo10.json").read_text())
    turns = [
        f"{turn['speaker']}: {turn['text']}"
        for conv in conversations
        for key, session in conv["conversation"].items()
        if key.startswith("session_") and isinstance(session, list)
        for turn in session
    ]
    return turns, [qa["question"] for conv in conversations for qa in conv["qa"]]


def scifact_sentences() -> list[str]:
    """SciFact abstracts' sentences of at least 40 characters, in corpus order."""
    sentences = []
    for line in (DATA / "scifact" / "corpus.jsonl").read_text().splitlines():
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", json.loads(line)["text"]):
            if len(sentence.strip()) >= 40:
                sentences.append(sentence.strip())
    return sentences


def distinct_texts() -> list[str]:
    """SciFact sentences and LoCoMo turns interleaved, each once (about 50,000)."""
    turns, _ = locomo()
    seen: set[str] = set()
    texts = []
    sentences = scifact_sentences()
    step = max(1, len(sentences) // len(turns))
    for i, sentence in enumerate(sentences):
        for text in (
            sentence,
            turns[i // step] if i % step == 0 and i // step < len(turns) else "",
        ):
            if text and text not in seen:
                seen.add(text)
                texts.append(text)
    return texts


# The service ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def manage(env: dict[str, str], *args: str, code: Path = ROOT) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@dataclass
class Service:
    url: str
    key: str
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of every process of the service (gunicorn's workers, servers)."""
        result = {}
        for name, process in self.processes.items():
            for pid, label in _tree(process.pid, name):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except FileNotFoundError:
                    continue
                rss = re.search(r"VmRSS:\s+(\d+) kB", status)
                if rss:
                    result[label] = int(rss.group(1)) / 1024
        return result


def _tree(pid: int, name: str) -> list[tuple[int, str]]:
    """`pid` and its children, labelled (the parent as `name`, children `name` 1, 2...)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(k) for k in children.read_text().split()] if children.exists() else []
    return [(pid, f"{name} (parent)" if kids else name)] + [
        (kid, f"{name} {i + 1}") for i, kid in enumerate(kids)
    ]


def base_env(data_dir: Path) -> dict[str, str]:
    """The embedded defaults on `data_dir`, whatever this shell's scaled-out variables say."""
    env = {k: v for k, v in os.environ.items() if k not in SCALED_OUT}
    env.update(
        DJANGO_SETTINGS_MODULE="ferrum_memory.settings.base",
        FERRUM_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
    )
    return env


@contextmanager
def service(
    data_dir: Path, servers: str, *, code: Path = ROOT, worker: bool = False
) -> Iterator[Service]:
    """gunicorn (and the index servers, and with `worker` a Celery worker as the Procfile's)
    on `data_dir`, run from the checkout `code` (another one's code measured beside this)."""
    port = _free_port()
    env = base_env(data_dir)
    env.update(
        GUNICORN_BIND=f"127.0.0.1:{port}",
        VECTOR_INDEX_SERVERS=servers,
        API_THROTTLE_RATE="1000000/min",
        LOG_LEVEL="WARNING",
    )
    manage(env, "migrate", "--noinput", code=code)
    key = manage(env, "create_api_key", "bench", code=code).splitlines()[-1]
    svc = Service(f"http://127.0.0.1:{port}", key, env)
    logs = []
    try:
        if servers != "0":
            log = (data_dir / "index-servers.log").open("w")
            logs.append(log)
            svc.processes["index server"] = subprocess.Popen(
                [sys.executable, "manage.py", "memory_index_server"],
                cwd=code,
                env={**env, "LOG_LEVEL": "INFO"},  # its graph builds, which scale waits for
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        log = (data_dir / "gunicorn.log").open("w")
        logs.append(log)
        svc.processes["web"] = subprocess.Popen(
            [
                str(BIN / "gunicorn"),
                "ferrum_memory.wsgi:application",
                "--config=gunicorn.conf.py",
                "--no-control-socket",  # one per machine: other gunicorns may run here
            ],
            cwd=code,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if worker:
            log = (data_dir / "worker.log").open("w")
            logs.append(log)
            svc.processes["worker"] = subprocess.Popen(
                [
                    str(BIN / "celery"),
                    "-A",
                    "ferrum_memory",
                    "worker",
                    "--loglevel=INFO",
                    "--concurrency=2",
                ],
                cwd=code,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 600
        while True:
            try:
                if requests.get(f"{svc.url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not come up; see {data_dir}")
            time.sleep(0.5)
        yield svc
    finally:
        for process in svc.processes.values():
            process.terminate()
        for process in svc.processes.values():
            process.wait(timeout=60)
        for log in logs:
            log.close()


def session(svc: Service) -> requests.Session:
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {svc.key}"
    return http


def post(http: requests.Session, url: str, body: Any, wanted: int) -> float:
    """Milliseconds the request took (checked for its status)."""
    start = time.perf_counter()
    response = http.post(url, json=body, timeout=120)
    elapsed = (time.perf_counter() - start) * 1000
    if response.status_code != wanted:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
    return elapsed


def stats(times: list[float]) -> tuple[str, ...]:
    a = np.array(times)
    return (
        f"{len(a):,}",
        *(f"{np.percentile(a, q):.1f}" for q in (50, 95, 99)),
        f"{a.max():.1f}",
    )


# stall ------------------------------------------------------------------------------------------


def part_stall(args: argparse.Namespace) -> None:
    texts = distinct_texts()
    if args.items > len(texts):
        raise SystemExit(f"--items at most {len(texts)} (distinct texts)")
    turns, questions = locomo()
    rows = []
    ingest = texts[args.preload : args.preload + args.items]
    # With two checkouts, they take turns (A B A B ...), so that both see the machine alike.
    for _ in range(args.rounds):
        for layout in args.layouts:
            for code in args.code:
                with tempfile.TemporaryDirectory(prefix="bench-indexing-") as folder:
                    env = base_env(Path(folder))
                    manage(env, "migrate", "--noinput")
                    made = (
                        fill(env, args.preload, args.preload, args.seed, agent=WRITER)
                        if args.preload
                        else ""
                    )
                    with service(Path(folder), LAYOUTS[layout], code=code) as svc:
                        name = f"{code.name} {layout}" if len(args.code) > 1 else layout
                        rows.append((name, *stall_run(svc, ingest, turns, questions)))
    print(
        f"\n## stall: {args.items:,} items stored one per request by 2 clients into one agent "
        f"holding {args.preload:,} already ({made or 'none'}, written to the DB), while 1 client "
        f"searches another agent of {READER_ITEMS} (hybrid, limit 10); gunicorn 2 workers x 4 "
        "threads, SQLite, qdrant-edge\n"
    )
    header = ("layout", "op", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "load during")
    table = []
    for layout, store_times, search_times, _, loads, _ in rows:
        table.append((layout, "store", *stats(store_times), loads))
        table.append((layout, "search", *stats(search_times), loads))
    print_table(header, table)
    print(f"\ntargets: {TARGETS}")
    for layout, _, _, slow, _, rss in rows:
        print(f"\n{layout}: slowest searches (ms @ s into the run): {slow}")
        print(f"{layout}: resident memory MB at the end: " + _rss_text(rss))


def stall_run(
    svc: Service, texts: list[str], turns: list[str], questions: list[str]
) -> tuple[list[float], list[float], str, str, dict[str, float]]:
    http = session(svc)
    reader_items = [{"agent_id": READER, "content": turn} for turn in turns[:READER_ITEMS]]
    post(http, f"{svc.url}/memory/store", reader_items, 201)
    stores: list[float] = []
    searches: list[tuple[float, float]] = []
    walls: list[tuple[float, float]] = []  # each search's wall-clock start and end
    done = threading.Event()
    start = time.perf_counter()
    loads: list[float] = []

    def writer(offset: int) -> None:
        own = session(svc)
        for i in range(offset, len(texts), 2):
            item = {"agent_id": WRITER, "content": texts[i]}
            stores.append(post(own, f"{svc.url}/memory/store", item, 201))

    def reader() -> None:
        own = session(svc)
        i = 0
        while not done.is_set():
            body = {"agent_id": READER, "query": questions[i % len(questions)], "limit": 10}
            sent = time.time()
            took = post(own, f"{svc.url}/memory/search", body, 200)
            searches.append((took, time.perf_counter() - start))
            walls.append((sent, sent + took / 1000))
            i += 1

    def progress() -> None:
        while not done.wait(30):
            loads.append(os.getloadavg()[0])
            print(
                f"  {len(stores):,} stored, {len(searches):,} searches, load {load()}",
                file=sys.stderr,
                flush=True,
            )

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    side = [threading.Thread(target=reader), threading.Thread(target=progress)]
    for thread in threads + side:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    for thread in side:
        thread.join()
    rss = svc.rss_mb()
    slow = sorted(searches, reverse=True)[:5]
    slow_text = ", ".join(f"{ms:.0f} @ {at:.0f}" for ms, at in slow)
    slow_text += "\n" + during_builds(Path(svc.env["FERRUM_DATA_DIR"]), searches, walls)
    load_text = f"{min(loads):.1f}-{max(loads):.1f}" if loads else load()
    return stores, [ms for ms, _ in searches], slow_text, load_text, rss


def during_builds(
    folder: Path, searches: list[tuple[float, float]], walls: list[tuple[float, float]]
) -> str:
    """The graph builds the service logged (in a web process, or in an index server), and the
    searches that overlapped one against the others: what a build costs a search."""
    builds = []
    for log in ("gunicorn.log", "index-servers.log"):
        path = folder / log
        for line in path.read_text().splitlines() if path.exists() else []:
            found = re.search(r"built graphs for ([\d.]+) s", line)
            if found and line.startswith("{"):
                end = datetime.strptime(json.loads(line)["time"], "%Y-%m-%d %H:%M:%S,%f")
                end_s = end.replace(tzinfo=UTC).timestamp()
                builds.append((end_s - float(found.group(1)), end_s, log))
    during = [
        ms for (ms, _), (a, b) in zip(searches, walls, strict=True) if _overlaps(a, b, builds)
    ]
    other = [
        ms for (ms, _), (a, b) in zip(searches, walls, strict=True) if not _overlaps(a, b, builds)
    ]
    text = "graph builds: " + (
        ", ".join(f"{b - a:.1f} s in {log.split('.')[0]}" for a, b, log in builds) or "none logged"
    )
    for name, part in (("overlapping a build", during), ("the others", other)):
        if part:
            text += (
                f"; searches {name}: {len(part)}, p50 {np.percentile(part, 50):.0f} ms, "
                f"max {max(part):.0f} ms"
            )
    return text


def _overlaps(start: float, end: float, builds: list[tuple[float, float, str]]) -> bool:
    return any(start < b and end > a for a, b, _ in builds)


# scale ------------------------------------------------------------------------------------------


def fill(env: dict[str, str], n: int, per_agent: int, seed: int, agent: str = "") -> str:
    """Write `n` memory items straight to the service's DB (one transaction, one revision, as a
    store would leave them): real LoCoMo turns and SciFact sentences with their real embeddings
    (the service's model), then copies of them with their vectors perturbed (each vector plus
    Gaussian noise of norm about 0.35, normalised: cosine about 0.94 to the original) and a
    numbered suffix, so no two items are equal. Embeddings of the distinct texts are cached in
    var/bench-indexing/ (delete it to embed again). Returns how the items were made."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "bench")!r})
from indexing import _fill_here
print(_fill_here({n}, {per_agent}, {seed}, {agent!r}))
"""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _fill_here(n: int, per_agent: int, seed: int, agent: str) -> str:
    import django

    sys.path.insert(0, str(ROOT))
    django.setup()
    from django.conf import settings
    from django.db import transaction
    from django.utils import timezone

    from ferrum_memory.core.revisions import revision_take
    from memory.models import MemoryItem
    from memory.services import content_hash

    texts, vectors = _real_vectors(min(n, REAL_TEXTS))
    rng = np.random.default_rng(seed)
    now = timezone.now()
    with transaction.atomic():
        revision = revision_take(name="memory")
        for offset in range(0, n, 5_000):
            rows = []
            for i in range(offset, min(n, offset + 5_000)):
                base = i % len(texts)
                vector = vectors[base]
                content = texts[base]
                if i >= len(texts):
                    vector = vector + rng.standard_normal(vector.shape[0]).astype("f4") * 0.018
                    vector /= np.linalg.norm(vector)
                    content = f"{content} (#{i // len(texts)})"
                rows.append(
                    MemoryItem(
                        agent_id=agent or f"agent-{i // per_agent:05d}",
                        content=content,
                        content_hash=content_hash(content),
                        created_at=now,
                        embedding=vector.astype("<f4").tobytes(),
                        embedding_model=settings.FASTEMBED_MODEL,
                        revision=revision,
                    )
                )
            MemoryItem.objects.bulk_create(rows)
    real = min(n, len(texts))
    return f"{real:,} real texts with their embeddings, {n - real:,} perturbed copies"


def _real_vectors(count: int) -> tuple[list[str], np.ndarray]:
    """The first `count` distinct texts and their embeddings (the service's model), embedded
    once and cached in var/bench-indexing/ (a longer run embeds only the texts it adds)."""
    cache = ROOT / "var" / "bench-indexing" / "vectors.npy"
    texts = distinct_texts()[:count]
    vectors = np.load(cache) if cache.exists() else np.zeros((0, 384), dtype=np.float32)
    if len(vectors) < count:
        from memory.embeddings import get_embedder

        more = get_embedder().embed_documents(texts[len(vectors) :])
        vectors = np.concatenate([vectors, more])
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, vectors)
    return texts, vectors[:count]


def part_scale(args: argparse.Namespace) -> None:
    _, questions = locomo()
    rows = []
    for n in args.scale_items:
        for per_agent in (each or n for each in args.per_agent):
            for layout in args.layouts:
                for code in args.code:
                    with tempfile.TemporaryDirectory(prefix="bench-indexing-") as folder:
                        run = scale_run(Path(folder), layout, n, per_agent, questions, args, code)
                    rows.append((code.name, *run))
                    print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    print("\n## scale: search over HTTP (1 client, hybrid, limit 10), rebuild, memory\n")
    print_table(
        (
            "code",
            "items",
            "per agent",
            "layout",
            "rebuild s",
            "search p50 ms",
            "p95 ms",
            "resident MB per process",
            "load",
        ),
        rows,
    )
    print("\ntarget: search p95 <= 25 ms at 10^6 items")


def scale_run(
    folder: Path,
    layout: str,
    n: int,
    per_agent: int,
    questions: list[str],
    args: argparse.Namespace,
    code: Path,
) -> tuple[str, ...]:
    env = base_env(folder)
    manage(env, "migrate", "--noinput")
    made = fill(env, n, per_agent, args.seed)
    print(f"  {n:,} items ({made}), {per_agent:,} per agent, {layout}", file=sys.stderr)
    start = time.perf_counter()
    if layout == "in-process":
        # One shard folder per web worker, built here: a worker building 10^5 items inside its
        # first request holds the GIL past gunicorn's 60 s timeout and is killed (and again).
        # With the code measured (`code`'s own bench/indexing.py).
        script = f"""
import sys
sys.path.insert(0, {str(code / "bench")!r})
from indexing import _prebuild_here
_prebuild_here({WEB_WORKERS})
"""
        subprocess.run([sys.executable, "-c", script], cwd=code, env=env, check=True)
    # A Celery worker as the Procfile's, with the servers only: in-process, each of its pool
    # processes would build a copy of the index of its own, as a web process does.
    servers = int(LAYOUTS[layout])
    with service(folder, LAYOUTS[layout], code=code, worker=servers > 0) as svc:
        # Build time: in-process, building each worker's shard (above) until both answer;
        # servers, the servers' first catch-up and graph builds, one server after the other.
        http = session(svc)
        agents = max(1, n // per_agent)
        if servers:
            # Before any search: at 10^6 one server's graph build (marked busy) can overlap the
            # other's first catch-up (not listening yet), and a search then waits out
            # LAST_TRY_SECONDS and gets 503.
            _wait_built(folder, servers)
        warm = {"agent_id": "agent-00000", "query": questions[0], "limit": 10}
        for _ in range(4):  # reaches both web processes
            post(http, f"{svc.url}/memory/search", warm, 200)
        rebuild = time.perf_counter() - start
        times = []
        for i in range(args.repeats):
            agent = f"agent-{(i * 7919) % agents:05d}"
            body = {"agent_id": agent, "query": questions[i % len(questions)], "limit": 10}
            times.append(post(http, f"{svc.url}/memory/search", body, 200))
        if servers:  # the worker's pool process that runs an index task
            _run_catch_up_task(svc, folder, code)
        rss = svc.rss_mb()
    p50, p95 = statistics.median(times), float(np.percentile(times, 95))
    return (
        f"{n:,}",
        f"{per_agent:,}",
        layout,
        f"{rebuild:.0f}",
        f"{p50:.1f}",
        f"{p95:.1f}",
        _rss_text(rss),
        load(),
    )


def _prebuild_here(workers: int) -> None:
    import django

    sys.path.insert(0, str(ROOT))
    django.setup()
    from django.conf import settings

    from memory.vector_index import EdgeEngine, VectorIndex

    indexes = [VectorIndex(EdgeEngine(settings.DATA_DIR / "qdrant-edge")) for _ in range(workers)]
    for index in indexes:
        index.catch_up()
    for index in indexes:
        index.close()


def _run_catch_up_task(svc: Service, folder: Path, code: Path) -> None:
    """Queue memory.index_catch_up (what beat queues every minute) and wait for its end."""
    send = "from memory.tasks import index_catch_up; index_catch_up.delay()"
    manage(svc.env, "shell", "-c", send, code=code)
    log = folder / "worker.log"
    deadline = time.monotonic() + 600
    while "succeeded" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(1)


def _wait_built(folder: Path, servers: int) -> None:
    """Until every server logged a graph build and none is busy."""
    log = folder / "index-servers.log"
    deadline = time.monotonic() + 3 * 3600
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        busy = list((folder / "qdrant-edge").glob("*.busy"))
        if text.count("built graphs") >= servers and not busy:
            return
        time.sleep(1)


def _rss_text(rss: dict[str, float]) -> str:
    return ", ".join(f"{name} {mb:.0f}" for name, mb in sorted(rss.items()))


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["stall", "scale"], choices=["stall", "scale"])
    parser.add_argument(
        "--layouts", nargs="+", default=["in-process", "servers"], choices=list(LAYOUTS)
    )
    parser.add_argument("--items", type=int, default=50_000, help="stall: items ingested")
    parser.add_argument(
        "--preload", type=int, default=0, help="stall: items the ingesting agent holds at start"
    )
    parser.add_argument("--scale-items", type=int, nargs="+", default=[100_000])
    parser.add_argument(
        "--per-agent",
        type=int,
        nargs="+",
        default=[100, 0],
        help="scale: items per agent, 0 for all in one agent",
    )
    parser.add_argument("--repeats", type=int, default=200, help="scale: searches timed")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--code",
        type=lambda path: Path(path).resolve(),
        nargs="+",
        default=[ROOT],
        help="run the service from these checkouts in turn (before and after a change)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="stall: runs of each checkout and layout, in turn"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the service it started
    print(f"load at start: {load()}")
    if "stall" in args.part:
        part_stall(args)
    if "scale" in args.part:
        part_scale(args)
    print(f"\nload at the end: {load()}")


if __name__ == "__main__":
    main()
