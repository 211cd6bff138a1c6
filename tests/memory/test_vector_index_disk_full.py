"""The qdrant-edge index on a (nearly) full disk: it stops writing instead of touching its
memory maps (a page the kernel cannot back is a SIGBUS that kills the process), searches answer
from what it holds, and it catches up once there is room (the whole service on a full tmpfs:
tests/faults/test_disk_full.py)."""

import pytest

from ferrum_memory.core import storage
from memory.services import reset_model_check
from memory.vector_index import EdgeEngine, reset_vector_index


@pytest.fixture
def edge_index(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.QDRANT_URL = ""  # the margin guards qdrant-edge's maps; a server has its own disk
    reset_vector_index()
    reset_model_check()
    yield
    reset_vector_index()


def search(api_client, query: str) -> set[str]:
    answer = api_client.post(
        "/memory/search", {"agent_id": "a", "query": query, "mode": "sparse"}, format="json"
    )
    assert answer.status_code == 200, answer.json()
    return {hit["item"]["content"] for hit in answer.json()["results"]}


@pytest.mark.django_db
@pytest.mark.usefixtures("edge_index")
def test_the_edge_index_waits_for_room_and_searches_go_on(api_client, monkeypatch):
    before = "The backup bucket is ferrum-backups."
    after = "The backup retention is thirty days."
    assert (
        api_client.post(
            "/memory/store", {"agent_id": "a", "content": before}, format="json"
        ).status_code
        == 201
    )

    # This machine's disk cannot be filled: the margin is raised past what it has free.
    monkeypatch.setattr(storage, "MIN_FREE_BYTES", 2**62)
    stored = api_client.post("/memory/store", {"agent_id": "a", "content": after}, format="json")
    assert stored.status_code == 201  # the DB took it; the index will
    assert stored.json()["indexed"] is False
    assert search(api_client, "backup") == {before}
    health = api_client.get("/health").json()
    assert {"storage", "vector_index"} <= set(health["failed"])

    monkeypatch.setattr(storage, "MIN_FREE_BYTES", 0)  # space is back
    assert search(api_client, "backup") == {before, after}
    assert api_client.get("/health").json()["backends"]["vector_index"]["lag"] == 0


def test_a_shard_is_not_opened_on_a_full_disk(tmp_path, monkeypatch):
    # Loading replays the shard's log through memory maps: on a full disk, a SIGBUS.
    monkeypatch.setattr(storage, "MIN_FREE_BYTES", 2**62)
    with pytest.raises(OSError) as raised:
        EdgeEngine(tmp_path / "qdrant-edge")
    assert storage.is_disk_full(raised.value)
    assert not (tmp_path / "qdrant-edge" / "shard-0").exists()  # no folder claimed
