"""A qdrant-edge shard folder left unusable (its files or its state.json damaged, as a crash
or a bad disk would leave them) is rebuilt from the DB by itself: the process that claims the
folder rebuilds it on its first catch-up, /health reports the index as rebuilding meanwhile,
and search finds every item afterwards. In this process, then through a real gunicorn."""

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memory import vector_index
from memory.models import MemoryItem
from memory.services import memory_store_many
from memory.vector_index import EdgeEngine, VectorIndex, get_vector_index
from tests.faults.conftest import web_process

AGENT = "corrupt"
TEXTS = (
    "The nightly backup of the orders database failed with a disk full error.",
    "We moved the backups to the object store bucket ferrum-backups.",
    "The retention of the backups is thirty days from now on.",
)


def overwrite(pattern: str, data: bytes) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        files = sorted(folder.glob(pattern))
        assert files, pattern
        for path in files:
            path.write_bytes(data)

    return damage


def remove(pattern: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        paths = sorted(folder.glob(pattern))
        assert paths, pattern
        for path in paths:
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    return damage


DAMAGE = {
    "state cut short": overwrite("state.json", b'{"cursor": 3, "mod'),
    "state not an object": overwrite("state.json", b"[3]"),
    "state empty": overwrite("state.json", b""),
    "shard config garbage": overwrite("shard/edge_config.json", b"{garbage"),
    "segment description garbage": overwrite("shard/segments/*/segment.json", b"\x00" * 64),
    "id mappings garbage": overwrite("shard/segments/*/mutable_id_tracker.mappings", b"\xff" * 99),
    "write-ahead log garbage": overwrite("shard/wal/open-1", b"\xab" * 4096),
    "segments gone": remove("shard/segments"),
}


def indexed_ids(engine: EdgeEngine) -> set[str]:
    from qdrant_edge import ScrollRequest

    records, _ = engine._need_shard().scroll(ScrollRequest(limit=1000, with_payload=False))
    return {str(record.id) for record in records}


def db_ids() -> set[str]:
    return {str(pk) for pk in MemoryItem.objects.values_list("id", flat=True)}


def built_folder(root: Path) -> Path:
    """A shard folder holding every item, closed as a process leaves it."""
    memory_store_many(items=[{"agent_id": AGENT, "content": text} for text in TEXTS])
    index = VectorIndex(EdgeEngine(root))
    index.catch_up()
    folder: Path = index.engine._path  # type: ignore[attr-defined]
    assert indexed_ids(index.engine) == db_ids()  # type: ignore[arg-type]
    index.close()
    return folder


@pytest.mark.django_db
@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_shard_folder_is_rebuilt_by_the_process_claiming_it(damage, tmp_path):
    root = tmp_path / "qdrant-edge"
    folder = built_folder(root)
    damage(folder)

    index = VectorIndex(EdgeEngine(root))
    assert index.engine._path == folder  # type: ignore[attr-defined]  # reused, not a new one
    assert index.cursor == -1  # unusable: to rebuild
    index.catch_up()
    assert index.cursor >= 0
    assert indexed_ids(index.engine) == db_ids()  # type: ignore[arg-type]
    index.close()
    again = VectorIndex(EdgeEngine(root))  # and the rebuilt folder opens as it should
    assert again.cursor == index.cursor and indexed_ids(again.engine) == db_ids()  # type: ignore[arg-type]
    again.close()


def process_folder_closed() -> Path:
    """Store the items (which indexes them in this process's index), close that index as a
    stopped process would, and return its folder, which the next get_vector_index claims."""
    memory_store_many(items=[{"agent_id": AGENT, "content": text} for text in TEXTS])
    folder: Path = get_vector_index().engine._path
    assert get_vector_index().cursor >= 0
    vector_index.reset_vector_index()
    return folder


@pytest.mark.django_db(transaction=True)
def test_health_reports_the_index_rebuilding_until_it_is_rebuilt(
    settings, tmp_path, anon_client, api_client, monkeypatch
):
    """The rebuild is held inside (reset waits for the test) so that /health is asked while it
    runs; a real rebuild of a large index takes minutes."""
    settings.DATA_DIR = tmp_path
    vector_index.reset_vector_index()
    try:
        folder = process_folder_closed()
        DAMAGE["id mappings garbage"](folder)
        inside, release = threading.Event(), threading.Event()
        reset = EdgeEngine.reset

        def held_reset(self: EdgeEngine, dim: int) -> None:
            inside.set()
            assert release.wait(timeout=60)
            reset(self, dim)

        monkeypatch.setattr(EdgeEngine, "reset", held_reset)
        settings.VECTOR_INDEX_HEALTH_WAIT_SECONDS = 0.2

        answer = anon_client.get("/health")
        assert inside.is_set() and get_vector_index().engine._path == folder
        assert answer.status_code == 200, answer.json()
        body = answer.json()
        assert body["status"] == "degraded" and body["failed"] == []
        assert body["backends"]["vector_index"]["status"] == "rebuilding"
        assert anon_client.get("/health").json()["status"] == "degraded"  # the same build

        release.set()
        wait_until(lambda: anon_client.get("/health").json()["status"] == "ok")
        assert anon_client.get("/health").json()["backends"]["vector_index"]["lag"] == 0
        hits = api_client.post(
            "/memory/search", {"agent_id": AGENT, "query": "backup retention days"}, format="json"
        ).json()["results"]
        assert hits[0]["item"]["content"] == TEXTS[2]
        assert {hit["item"]["point_id"] for hit in hits} == db_ids()
    finally:
        vector_index.reset_vector_index()


@pytest.mark.django_db(transaction=True)
def test_health_reports_a_failed_build_as_an_error_and_builds_again(
    settings, tmp_path, anon_client, monkeypatch
):
    settings.DATA_DIR = tmp_path
    vector_index.reset_vector_index()
    try:
        DAMAGE["state cut short"](process_folder_closed())
        reset = EdgeEngine.reset

        def failing_reset(self: EdgeEngine, dim: int) -> None:
            raise OSError("No space left on device")

        monkeypatch.setattr(EdgeEngine, "reset", failing_reset)
        answer = anon_client.get("/health")
        assert answer.status_code == 503
        assert "No space left" in answer.json()["backends"]["vector_index"]["error"]
        monkeypatch.setattr(EdgeEngine, "reset", reset)
        answer = anon_client.get("/health")
        assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.json()
    finally:
        vector_index.reset_vector_index()


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.live_server
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("damage", ["id mappings garbage", "state cut short"])
def test_a_web_process_started_on_a_damaged_folder_rebuilds_it(damage, api_key, tmp_path):
    """Through a real gunicorn: /health waits for no build (VECTOR_INDEX_HEALTH_WAIT_SECONDS=0),
    so it reports the rebuild it starts, then ok; search finds every item."""
    with web_process(tmp_path, api_key[1]) as web:
        for text in TEXTS:
            stored = web.call("POST", "/memory/store", {"agent_id": AGENT, "content": text})
            assert stored.status == 201 and stored.json()["indexed"] is True, web.logs()
    [folder] = (tmp_path / "data" / "qdrant-edge").glob("shard-*")
    DAMAGE[damage](folder)

    with web_process(tmp_path, api_key[1], VECTOR_INDEX_HEALTH_WAIT_SECONDS="0") as web:
        first = web.call("GET", "/health")
        assert first.status == 200, first.body
        assert first.json()["status"] == "degraded", first.body
        assert first.json()["backends"]["vector_index"]["status"] == "rebuilding"
        wait_until(lambda: web.call("GET", "/health").json()["status"] == "ok")
        found = web.call("POST", "/memory/search", {"agent_id": AGENT, "query": "backups"})
        assert found.status == 200, web.logs()
        assert {hit["item"]["point_id"] for hit in found.json()["results"]} == db_ids()
        assert "unreadable; rebuilding" in (tmp_path / "web.log").read_text()
    assert list((tmp_path / "data" / "qdrant-edge").glob("shard-*")) == [folder]
