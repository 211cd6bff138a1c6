"""A full disk under the embedded stack, with real processes: the data folder (SQLite and its
WAL, the qdrant-edge shards, the broker file, the file cache) on a small tmpfs the test
mounts, gunicorn serving from it. The test writes until the disk is full, then checks that a
write answers 507 with a JSON error (or succeeds: SQLite may still find room in pages it
holds), that reads keep working and /health names the storage, that everything acknowledged
is there once and SQLite's integrity check passes. Then it frees the space and, with no
restart, writes succeed again and the index catches up with what it could not write."""

import errno
import random
import shutil
import sqlite3
import string
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.experience.test_dream_e2e import ROOT, process_env
from tests.faults.conftest import Response, Web, small_filesystem, web_process
from tests.sessions.conftest import chat

# The embedded stack on its own SQLite file, whatever database the run uses: the embedded
# run covers it, the PostgreSQL run would only repeat it.
pytestmark = pytest.mark.live_server

AGENT = "full"
FILESYSTEM_MB = 48
LEFT_BY_THE_BALLAST = 2 * 1024 * 1024  # what the service's own writes then use up
BIG_TASK = "x" * 19_000  # an experience's task near its 20,000-character cap
CHUNK = 64 * 1024
MAX_FILLING_REQUESTS = 200


def experience(task: str = "Fix the flaky upload test") -> dict[str, Any]:
    return {
        "id": f"exp-{uuid.uuid4().hex}",
        "agent_id": AGENT,
        "task": task,
        "tool_calls": [{"name": "pytest", "arguments": {"path": "tests/"}, "output": "1 failed"}],
        "test_result": {"passed": False, "total": 3, "failed": 1},
        "reward": 0.5,
    }


class Ledger:
    """The writes the service acknowledged: every one must be there, once, at the end."""

    def __init__(self, web: Web) -> None:
        self.web = web
        self.memories: dict[str, str] = {}  # point id: the word only its content has
        self.experiences: set[str] = set()

    def store(self) -> Response:
        word = "".join(random.choices(string.ascii_lowercase, k=12))  # one BM25 term
        answer = self.web.call(
            "POST",
            "/memory/store",
            {"agent_id": AGENT, "content": f"The release checklist item {word} was verified."},
        )
        if answer.status == 201:
            self.memories[answer.json()["point_id"]] = word
        return answer

    def ingest(self, bodies: list[dict[str, Any]]) -> Response:
        answer = self.web.call("POST", "/experience/", bodies)
        if answer.status == 201:
            self.experiences |= {body["id"] for body in bodies}
        return answer


def assert_storage_full(answer: Response) -> None:
    assert answer.status == 507, (answer.status, answer.body[:500])
    assert answer.content_type.startswith("application/json")
    assert "storage is full" in answer.json()["detail"]


def write_ballast(folder: Path, leave: int) -> Path:
    """Zeros in a new file of the folder until `leave` bytes are free there (0: to ENOSPC)."""
    ballast = folder / f"ballast-{uuid.uuid4().hex[:6]}"
    try:
        with ballast.open("ab") as out:
            while (free := shutil.disk_usage(folder).free) > leave or leave == 0:
                out.write(b"\0" * max(4096, min(CHUNK, free - leave)))
                out.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    return ballast


def found_by_search(web: Web, word: str) -> bool:
    answer = web.call(
        "POST", "/memory/search", {"agent_id": AGENT, "query": word, "mode": "sparse", "limit": 5}
    )
    assert answer.status == 200, answer.body[:500]
    return any(word in hit["item"]["content"] for hit in answer.json()["results"])


def check_database(data: Path, ledger: Ledger) -> None:
    """The SQLite file read beside the service: intact, every acknowledged write in it once."""
    conn = sqlite3.connect(f"file:{data / 'ferrum_memory.sqlite3'}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        items = [uuid.UUID(row[0]) for row in conn.execute("SELECT id FROM memory_memoryitem")]
        assert sorted(items) == sorted(map(uuid.UUID, ledger.memories))
        rows = [row[0] for row in conn.execute("SELECT experience_id FROM experience_experience")]
        assert len(rows) == len(set(rows))
        assert ledger.experiences <= set(rows)
    finally:
        conn.close()


@pytest.fixture
def service_on_small_disk(tmp_path: Path) -> Iterator[tuple[Web, Path]]:
    """gunicorn on the embedded stack, its whole data folder on a tmpfs of FILESYSTEM_MB."""
    with small_filesystem(tmp_path / "data", FILESYSTEM_MB) as data:
        env = {
            **process_env(tmp_path),
            "FERRUM_DATA_DIR": str(data),
            "SQLITE_PATH": str(data / "ferrum_memory.sqlite3"),
            "CELERY_BROKER_URL": f"sqla+sqlite:///{data / 'celery-broker.sqlite3'}",
            "DATABASE_URL": "",
            "REDIS_URL": "",
        }

        def manage(*command: str) -> str:
            return subprocess.run(
                [sys.executable, "manage.py", *command],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout

        manage("migrate", "--noinput")
        key = manage("create_api_key", "disk-full").strip().splitlines()[-1]
        with web_process(tmp_path, key, **env) as web:
            yield web, data


def test_a_full_disk_refuses_writes_with_507_keeps_reads_and_recovers_by_itself(
    service_on_small_disk,
):
    web, data = service_on_small_disk
    ledger = Ledger(web)
    observed: dict[str, int] = {}

    # Before: a few of each kind of write, all acknowledged.
    for _ in range(5):
        assert ledger.store().status == 201
    assert ledger.ingest([experience() for _ in range(20)]).status == 201
    session = web.call("POST", "/session/start", {"agent_id": AGENT, "task": "Release"})
    assert session.status == 201
    sid = session.json()["session_id"]
    closing = web.call("POST", "/session/start", {"agent_id": AGENT, "task": "Wrap up"})
    assert closing.status == 201
    to_close = closing.json()["session_id"]
    updated = web.call(
        "PUT", f"/session/{sid}", {"version": 1, "append_messages": chat("Ship it on Friday.")}
    )
    assert updated.status == 200, updated.body
    version = updated.json()["version"]
    assert web.call("GET", "/health").status == 200

    # Fill: a ballast file leaves a little room, which big experience batches then take up.
    ballasts = [write_ballast(data, LEFT_BY_THE_BALLAST)]
    for _ in range(MAX_FILLING_REQUESTS):
        answer = ledger.ingest([experience(BIG_TASK) for _ in range(10)])
        if answer.status != 201:
            break
    else:
        pytest.fail(f"the disk never filled: {shutil.disk_usage(data)}\n{web.logs()}")
    assert_storage_full(answer)
    observed["experience ingest (filling)"] = answer.status
    ballasts.append(write_ballast(data, 0))  # not a byte left for anyone
    assert shutil.disk_usage(data).free < 64 * 1024

    # Every write answers 507 or, when SQLite still finds room in pages it holds, succeeds.
    writes = {
        "memory store": ledger.store,
        "experience ingest": lambda: ledger.ingest([experience(BIG_TASK) for _ in range(10)]),
        "session start": lambda: web.call(
            "POST", "/session/start", {"agent_id": AGENT, "task": "Another"}
        ),
        "session update": lambda: web.call(
            "PUT",
            f"/session/{sid}",
            {"version": version, "append_messages": chat("One more turn " + "y" * 20_000)},
        ),
        # The consolidation row, then the message on the broker file: 507 if either fails.
        "session close": lambda: web.call("POST", "/session/close", {"session_id": to_close}),
        "td update": lambda: web.call(
            "PUT",
            "/experience/td-error",
            {"experience_id": next(iter(ledger.experiences)), "td_error": 0.25},
        ),
    }
    for name, write in writes.items():
        answer = write()
        observed[name] = answer.status
        if answer.status != 507:
            assert answer.status in (200, 201), (name, answer.status, answer.body[:500])
        else:
            assert_storage_full(answer)
    assert observed["experience ingest"] == 507
    if observed["session update"] == 200:
        version += 1

    # Reads keep working, and /health says what is wrong.
    reads = {
        "memory get": ("GET", f"/memory/{next(iter(ledger.memories))}", None),
        "memory list": ("GET", f"/memory/?agent_id={AGENT}", None),
        "memory search": ("POST", "/memory/search", {"agent_id": AGENT, "query": "checklist"}),
        "memory context": (
            "POST",
            "/memory/context",
            {"agent_id": AGENT, "query": "release checklist", "token_budget": 500},
        ),
        "replay": ("GET", f"/experience/replay?agent_id={AGENT}&batch_size=8", None),
        "session get": ("GET", f"/session/{sid}", None),
    }
    for name, (method, path, body) in reads.items():
        answer = web.call(method, path, body)
        observed[name] = answer.status
        assert answer.status == 200, (name, answer.status, answer.body[:500], web.logs())
    health = web.call("GET", "/health")
    observed["health"] = health.status
    assert health.status == 503
    assert "storage" in health.json()["failed"]
    assert "full" in health.json()["backends"]["storage"]["error"]
    check_database(data, ledger)
    print("\nwhile full:", observed)

    # Space returns: with no restart, writes succeed and the index catches up.
    for ballast in ballasts:
        ballast.unlink(missing_ok=True)
    assert ledger.store().status == 201
    assert ledger.ingest([experience() for _ in range(5)]).status == 201
    assert web.call("PUT", f"/session/{sid}", {"version": version}).status == 200
    closed = web.call("POST", "/session/close", {"session_id": to_close})
    assert closed.status == 202, closed.body  # again, or for the first time: one consolidation
    for word in ledger.memories.values():
        assert found_by_search(web, word), word
    health = web.call("GET", "/health").json()
    assert health["status"] == "ok", health
    assert health["backends"]["vector_index"]["lag"] == 0
    check_database(data, ledger)
