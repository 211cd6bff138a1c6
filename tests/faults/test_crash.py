"""Crash consistency of the embedded stack (SQLite in WAL mode, qdrant-edge shard folders, the
SQLite broker), with real processes: client threads store memories, POST experiences (with
their own ids, so each acknowledgement can be checked), run sessions (start, updates, close:
the worker consolidates) and sample replay, while a seeded killer SIGKILLs, at random moments,
the whole gunicorn process group (a hard crash of the web process), a single gunicorn worker
(its master starts another) or the Celery worker, and restarts what it killed.

Afterwards: every acknowledged write is in the DB exactly once; the sweep, run as beat runs
it, gets every closed session consolidated (the SQLite broker never redelivers a message a
killed worker took); the replay index equals the DB's sampleable rows, in the web process and
when caught up incrementally across the crashes; no shard folder stays locked; each shard
folder, caught up, holds exactly the DB's items for each agent."""

import fcntl
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db.models import Count, Q
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from experience.models import Experience
from experience.replay_index import ReplayIndex
from memory.models import MemoryItem
from memory.vector_index import EdgeEngine, VectorIndex
from sessions.models import Consolidation, Session
from sessions.services import session_sweep
from tests.experience.test_dream_e2e import ROOT, process_env, stop_process, worker_command
from tests.faults.conftest import answers, free_port

pytestmark = pytest.mark.live_server  # the embedded stack: the embedded run only

SEED = int(os.environ.get("CRASH_SEED", "20"))
KILLS = int(os.environ.get("CRASH_KILLS", "50"))
CLIENTS = 3
AGENTS = ("crash-a", "crash-b")
WEB_WORKERS = 2
# What the killer does, with its weight: the whole gunicorn group, one gunicorn worker, the
# Celery worker.
KINDS = {"web": 1, "web_worker": 2, "worker": 2}
PAUSE = (0.1, 1.0)  # seconds before a kill, once the service answers clients again
LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo10.json"
WAIT = 120  # seconds: any wait of this test is bounded by it


def locomo_turns(conversations: range) -> list[str]:
    """Distinct LoCoMo turns, long enough that no two are near duplicates of each other. Each
    is stripped, as the service stores it: 162 turns end in a space, and the stored content of
    one would not equal the text sent."""
    data = json.loads(LOCOMO.read_text())
    turns: dict[str, None] = {}
    for conversation in (data[i]["conversation"] for i in conversations):
        for key, session in conversation.items():
            if key.startswith("session_") and isinstance(session, list):
                texts = (t["text"].strip() for t in session)
                turns.update((text, None) for text in texts if len(text) >= 60)
    return list(turns)


class Stack:
    """gunicorn (its own process group, two workers) and a Celery worker on the test's
    database and broker, each killed and restarted at will; logs appended across restarts."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.env = {
            **env,
            "GUNICORN_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": str(WEB_WORKERS),
            "GUNICORN_THREADS": "2",
        }
        self.web_log, self.worker_log = tmp_path / "web.log", tmp_path / "worker.log"
        self.web: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_starts = 0

    def _spawn(self, command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            return subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # killpg reaches the process and its children only
            )

    def start_web(self) -> None:
        gunicorn = Path(sys.executable).parent / "gunicorn"
        command = [str(gunicorn), "ferrum_memory.wsgi:application", "--config", "gunicorn.conf.py"]
        self.web = self._spawn([*command, "--no-control-socket"], self.web_log)

    def start_worker(self) -> None:
        self.worker = self._spawn(worker_command("crash"), self.worker_log)
        self.worker_starts += 1

    def worker_ready(self) -> bool:
        return self.worker_log.read_text().count(" ready.") >= self.worker_starts

    def web_workers(self) -> list[int]:
        assert self.web is not None
        children = Path(f"/proc/{self.web.pid}/task/{self.web.pid}/children")
        try:
            return [int(pid) for pid in children.read_text().split()]
        except FileNotFoundError:
            return []

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes] | None) -> None:
        """SIGKILL the group and wait until every process of it has exited: the leader's
        children are not ours to wait for, and a dying process holds its shard folder's lock
        until it has let go of all its memory."""
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=WAIT)
            deadline = time.monotonic() + WAIT
            while group_members(process.pid):
                assert time.monotonic() < deadline, group_members(process.pid)
                time.sleep(0.05)

    def kill(self, kind: str, rng: random.Random) -> bool:
        """SIGKILL, then restart (gunicorn restarts its own workers); False if nothing to kill."""
        if kind == "web":
            self._kill_group(self.web)
            self.start_web()
        elif kind == "web_worker":
            workers = self.web_workers()
            if not workers:
                return False
            os.kill(rng.choice(workers), signal.SIGKILL)
        else:
            self._kill_group(self.worker)
            self.start_worker()
        return True

    def wait_for_web(self) -> None:
        deadline = time.monotonic() + WAIT
        while not (answers(self.port) and len(self.web_workers()) == WEB_WORKERS):
            assert time.monotonic() < deadline, self.logs()
            time.sleep(0.1)

    def logs(self) -> str:
        return "".join(
            f"--- {path.name} ---\n{path.read_text()[-6000:]}\n"
            for path in (self.web_log, self.worker_log)
            if path.exists()
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for process in (self.web, self.worker):
            if process is not None and process.poll() is None:
                if sig == signal.SIGKILL:
                    self._kill_group(process)
                else:
                    os.killpg(process.pid, sig)
                    stop_process(process, timeout=30)


def group_members(pgid: int) -> list[int]:
    """The processes of a process group that have not exited yet (zombies have)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


@dataclass
class Tally:
    """What the clients were told (acknowledgements) and saw, shared by their threads."""

    stored: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # content: ...
    experiences: dict[str, str] = field(default_factory=dict)  # id: agent
    sessions: dict[str, list[str]] = field(default_factory=dict)  # session id: acked turns
    closed: set[str] = field(default_factory=set)
    samples: int = 0
    answered: int = 0  # requests answered (not 5xx): progress between kills
    no_answer: int = 0  # requests cut off by a kill (no response)
    server_errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Client:
    """One client thread: it retries what was not acknowledged, as a real client would, until
    `stop` is set; `draining` ends the loop after the operation under way."""

    def __init__(self, number: int, stack: Stack, key: str, tally: Tally, texts: dict) -> None:
        self.number, self.tally, self.texts = number, tally, texts
        self.rng = random.Random(SEED * 100 + number)
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{stack.port}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        self.stop = threading.Event()
        self.draining = threading.Event()
        self.sent = 0

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """The response, or None when the request was cut off (retry) or stopped."""
        if self.stop.is_set():
            raise Stopped
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError:
            with self.tally.lock:
                self.tally.no_answer += 1
            time.sleep(0.2)
            return None
        if response.status_code >= 500:
            with self.tally.lock:
                self.tally.server_errors.append(
                    f"{method} {path} {response.status_code} {response.text[:300]}"
                )
            time.sleep(0.2)
            return None
        with self.tally.lock:
            self.tally.answered += 1
        return response

    def until_answered(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        while (response := self.call(method, path, **kwargs)) is None:
            pass
        return response

    def text(self, pool: str) -> str:
        with self.tally.lock:
            return self.texts[pool].pop()

    def run(self) -> None:
        operations: list[Callable[[], None]] = [
            self.store,
            self.store,
            self.experience,
            self.experience,
            self.session,
            self.replay,
        ]
        try:
            while not self.draining.is_set():
                self.rng.choice(operations)()
        except Stopped:
            pass
        finally:
            self.http.close()

    def store(self) -> None:
        agent, content = self.rng.choice(AGENTS), self.text("memories")
        body = {"agent_id": agent, "content": content, "tags": ["crash"]}
        answer = self.until_answered("POST", "/memory/store", json=body)
        assert answer.status_code in (200, 201), answer.text
        stored = answer.json()
        with self.tally.lock:
            self.tally.stored[content] = (agent, stored["point_id"], stored["duplicate"])

    def experience(self) -> None:
        self.sent += 1
        experience_id, agent = f"crash-{self.number}-{self.sent}", self.rng.choice(AGENTS)
        body = {
            "id": experience_id,
            "agent_id": agent,
            "task": self.text("memories"),
            "reward": self.rng.uniform(-1, 1),
            "td_error": self.rng.uniform(0.01, 2),
        }
        answer = self.until_answered("POST", "/experience/", json=body)
        assert answer.status_code in (200, 201), answer.text
        with self.tally.lock:
            self.tally.experiences[experience_id] = agent

    def replay(self) -> None:
        query = {"agent_id": self.rng.choice(AGENTS), "batch_size": 4}
        answer = self.until_answered("GET", "/experience/replay", params=query)
        assert answer.status_code in (200, 409), answer.text
        if answer.status_code == 200:
            with self.tally.lock:
                self.tally.samples += 1

    def session(self) -> None:
        agent = self.rng.choice(AGENTS)
        first = self.text("turns")
        start = self.until_answered(
            "POST", "/session/start", json={"agent_id": agent, "messages": turns(first)}
        )
        assert start.status_code == 201, start.text
        sid, version = start.json()["session_id"], start.json()["version"]
        acked = [first]
        with self.tally.lock:
            self.tally.sessions[sid] = acked
        for _ in range(2):
            version = self.append(sid, version, self.text("turns"))
        state = self.until_answered("GET", f"/session/{sid}")
        assert state.status_code == 200, state.text
        # Each acknowledged turn is in the working memory once, and nothing else is.
        assert [m["content"] for m in state.json()["messages"]] == acked, sid
        closed = self.until_answered("POST", "/session/close", json={"session_id": sid})
        assert closed.status_code == 202, closed.text
        with self.tally.lock:
            self.tally.closed.add(sid)

    def append(self, sid: str, version: int, turn: str) -> int:
        """Append one turn at `version`. Not acknowledged (cut off) or refused as stale: read
        the state; the turn is there (the cut-off request was committed) or is sent again."""
        while True:
            body = {"version": version, "append_messages": turns(turn)}
            answer = self.call("PUT", f"/session/{sid}", json=body)
            if answer is not None and answer.status_code == 200:
                self.tally.sessions[sid].append(turn)
                return int(answer.json()["version"])
            assert answer is None or answer.status_code == 409, answer.text
            state = self.until_answered("GET", f"/session/{sid}").json()
            if state["messages"][-1]["content"] == turn:
                self.tally.sessions[sid].append(turn)
                return int(state["version"])
            version = int(state["version"])


class Stopped(Exception):
    pass


def turns(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "name": "Ada", "content": text} for text in texts]


@pytest.fixture
def crash_stack(tmp_path: Path, send_tasks_to) -> Iterator[Stack]:
    """The stack, the worker started first (see celery_processes: a new SQLite broker's queue
    must not be declared by two processes at once); this test process sends to its broker."""
    PeriodicTask.objects.update(enabled=False)  # the test runs the sweep itself
    env = process_env(tmp_path)
    stack = Stack(tmp_path, env)
    send_tasks_to(env["CELERY_BROKER_URL"])
    stack.start_worker()
    deadline = time.monotonic() + WAIT
    while not stack.worker_ready():
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.2)
    stack.start_web()
    try:
        stack.wait_for_web()
        yield stack
    finally:
        stack.stop(signal.SIGKILL)


def wait_until(condition: Callable[[], Any], what: str, logs: Callable[[], str]) -> Any:
    deadline = time.monotonic() + WAIT
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs()}"
        time.sleep(0.05)
    return result


def sampleable(agent: str) -> dict[int, float]:
    """{pk: priority} of the agent's rows replay may draw: not retired, not expired."""
    rows = Experience.objects.filter(agent_id=agent, retired_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )
    return dict(rows.values_list("pk", "priority"))


def held_folders(root: Path) -> list[Path]:
    """The shard folders a live process holds (flock)."""
    held = []
    for folder in sorted(root.glob("shard-*")):
        with (folder / "lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(folder)
    return held


def claim_every_folder(root: Path) -> list[EdgeEngine]:
    """Open every shard folder under root in this process (each EdgeEngine claims the first
    free one); fails if a folder is still locked, since a new folder would be made instead."""
    folders = sorted(root.glob("shard-*"))
    assert held_folders(root) == []
    engines = [EdgeEngine(root) for _ in folders]
    assert sorted(root.glob("shard-*")) == folders
    return engines


def indexed_points(engine: EdgeEngine) -> Counter[tuple[str, str]]:
    """(agent, point id) of every point in the shard, counted."""
    from qdrant_edge import ScrollRequest

    points: Counter[tuple[str, str]] = Counter()
    offset = None
    while True:
        request = ScrollRequest(offset=offset, limit=1000, with_payload=True, with_vector=False)
        records, offset = engine._need_shard().scroll(request)
        points.update((r.payload["agent_id"], str(r.id)) for r in records)
        if offset is None:
            return points


@pytest.mark.django_db(transaction=True)
def test_sigkills_under_load_lose_no_acknowledged_write(
    crash_stack: Stack, api_key, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="httpx")  # not a line per request
    stack, began = crash_stack, time.monotonic()
    rng = random.Random(SEED)
    texts = {"memories": locomo_turns(range(0, 5)), "turns": locomo_turns(range(5, 10))}
    for pool in texts.values():
        rng.shuffle(pool)
    tally = Tally()
    clients = [Client(n, stack, api_key[1], tally, texts) for n in range(CLIENTS)]
    threads = [threading.Thread(target=c.run, name=f"client-{c.number}") for c in clients]
    replay_index = ReplayIndex()  # caught up across the crashes, change by change
    for thread in threads:
        thread.start()
    kills: Counter[str] = Counter()
    try:
        while sum(kills.values()) < KILLS:
            # Each kill comes after the service answered again (else a kill would mostly hit
            # a process still starting), at a random moment within the clients' work.
            stack.wait_for_web()
            answered = tally.answered
            wait_until(lambda: tally.answered > answered, "an answer", stack.logs)  # noqa: B023
            time.sleep(rng.uniform(*PAUSE))
            kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
            if kind == "worker" and not stack.worker_ready():
                kind = "web_worker"  # a worker killed while it starts would have run nothing
            if stack.kill(kind, rng):
                kills[kind] += 1
                print(f"{time.monotonic() - began:6.1f}s kill {sum(kills.values())}: {kind}")
            replay_index.catch_up()
        killing = time.monotonic() - began
        for client in clients:
            client.draining.set()  # each finishes (is acknowledged for) what it was doing
        for thread in threads:
            thread.join(timeout=WAIT)
        assert not any(t.is_alive() for t in threads), stack.logs()
    finally:
        for client in clients:
            client.stop.set()
        for thread in threads:
            thread.join(timeout=WAIT)

    # Every acknowledged write is in the DB, once.
    items = MemoryItem.objects.filter(agent_id__in=AGENTS, session_id="")  # not consolidated
    by_content = Counter(items.values_list("content", flat=True))
    assert all(n == 1 for n in by_content.values()), by_content.most_common(3)
    ids = {str(pk) for pk in MemoryItem.objects.values_list("id", flat=True)}
    for content, (_agent, point_id, duplicate) in tally.stored.items():
        assert point_id in ids, content
        if not duplicate:
            assert by_content[content] == 1, content
    stored = Counter(
        Experience.objects.filter(experience_id__in=tally.experiences).values_list(
            "experience_id", flat=True
        )
    )
    assert set(stored) == set(tally.experiences) and set(stored.values()) == {1}
    for sid, acked in tally.sessions.items():
        session = Session.objects.get(pk=sid)
        assert session.version == len(acked), sid  # each append once: version 1 + appends

    # Every closed session gets its consolidation: beat's sweep sends again what the broker
    # lost, as if the stale horizon (2 minutes) and the killed runs' leases (6 minutes) had
    # passed; the worker alive now runs one task at a time, so none of its runs is cut short.
    stack.wait_for_web()
    lost = Counter(
        Consolidation.objects.filter(session_id__in=tally.closed)
        .exclude(status="done")
        .values_list("status", flat=True)
    )
    later = timezone.now() + timedelta(hours=1)
    Consolidation.objects.filter(status="running").update(lease_until=timezone.now())
    report = session_sweep(now=later)

    def consolidated() -> bool:
        pending = Consolidation.objects.filter(session_id__in=tally.closed).exclude(status="done")
        return not pending.exists()

    wait_until(consolidated, "every closed session's consolidation", stack.logs)
    ids = {str(pk) for pk in MemoryItem.objects.values_list("id", flat=True)}
    closed = Consolidation.objects.filter(session_id__in=tally.closed)
    assert closed.values("session_id").distinct().count() == len(tally.closed)
    assert not closed.values("session_id", "version").annotate(n=Count("id")).filter(n__gt=1)
    for consolidation in closed:
        assert consolidation.memory_item_ids, consolidation.pk
        assert set(consolidation.memory_item_ids) <= ids, consolidation.pk

    # The replay index equals the DB's sampleable rows: this process's, caught up change by
    # change across the crashes, a new one built from scratch, and the web process's own.
    fresh = ReplayIndex()
    for agent in AGENTS:
        expected = sampleable(agent)
        replay_index.catch_up()
        fresh.catch_up()
        assert replay_index.priorities(agent) == expected
        assert fresh.priorities(agent) == expected
        answer = httpx.get(
            f"http://127.0.0.1:{stack.port}/experience/replay",
            params={"agent_id": agent, "batch_size": 4},
            headers={"Authorization": f"Bearer {api_key[1]}"},
            timeout=30,
        )
        assert answer.status_code == (200 if expected else 409), answer.text
        assert answer.json()["buffer_size"] == len(expected)

    # While the service runs, only its live processes hold a folder: each killed one's lock
    # went with it.
    root = tmp_path / "data" / "qdrant-edge"
    held = len(held_folders(root))
    assert held <= WEB_WORKERS + 1

    # A last hard crash of everything; then no shard folder is left locked, there are no more
    # folders than processes holding one at a time, and each folder, caught up, holds exactly
    # the DB's items of each agent.
    stack.stop(signal.SIGKILL)
    engines = claim_every_folder(root)
    assert 1 <= len(engines) <= WEB_WORKERS + 1
    expected_points = Counter(
        (agent, str(pk)) for pk, agent in MemoryItem.objects.values_list("id", "agent_id")
    )
    try:
        for engine in engines:
            VectorIndex(engine).catch_up()
            assert indexed_points(engine) == expected_points
    finally:
        for engine in engines:
            engine.close()

    summary = {
        "kills": dict(kills),
        "memories acknowledged": len(tally.stored),
        "experiences acknowledged": len(tally.experiences),
        "sessions": len(tally.sessions),
        "sessions closed": len(tally.closed),
        "turns acknowledged": sum(len(t) for t in tally.sessions.values()),
        "replay samples": tally.samples,
        "requests cut off": tally.no_answer,
        "5xx": len(tally.server_errors),
        "closes not consolidated when the clients stopped": dict(lost),
        "sweep resent": report.resent,
        "shard folders": len(engines),
        "held while running": held,
        "points per folder": sum(expected_points.values()),
        "seconds killing": round(killing),
        "seconds in all": round(time.monotonic() - began),
    }
    print("crash test:", json.dumps(summary))
    assert not tally.server_errors, tally.server_errors[:5]
