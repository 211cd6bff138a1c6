"""The vector index (a Qdrant server) unavailable mid-run: stores are accepted (201,
indexed=false) and nothing else fails; when it is back, what was stored meanwhile is indexed
by the next catch-up, on top of what it already held (from its cursor, not a rebuild).

No Qdrant server binary installs here: qdrant-client's in-process mode stands in for the
server, and the outage is that engine's client swapped for one aimed at a closed port (the
real client and engine code fail as they would against a stopped server)."""

import pytest
from qdrant_client import QdrantClient

from memory.tasks import index_catch_up
from memory.vector_index import get_vector_index, reset_vector_index
from tests.faults.conftest import free_port

AGENT = "indexer"


def search(api_client, query: str):
    return api_client.post("/memory/search", {"agent_id": AGENT, "query": query}, format="json")


def store(api_client, content: str):
    response = api_client.post(
        "/memory/store", {"agent_id": AGENT, "content": content}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.mark.django_db
def test_stores_are_accepted_while_the_index_is_down_and_indexed_when_it_returns(
    api_client, settings, monkeypatch
):
    settings.QDRANT_URL = ":memory:"
    reset_vector_index()
    try:
        before = store(api_client, "The staging cluster runs in eu-west-1.")
        assert before["indexed"] is True
        engine = get_vector_index().engine
        server = engine._client
        cursor = get_vector_index().cursor

        down = QdrantClient(url=f"http://127.0.0.1:{free_port()}", timeout=1)
        monkeypatch.setattr(engine, "_client", down)
        during = store(api_client, "The production database moved to Frankfurt on Monday.")
        assert during["indexed"] is False
        failed = search(api_client, "where is the production database?")
        assert failed.status_code == 503, failed.json()
        assert "vector index" in failed.json()["detail"].lower()
        assert api_client.get("/health").json()["backends"]["vector_index"]["status"] == "error"
        assert api_client.get("/experience/stats").status_code == 200

        monkeypatch.setattr(engine, "_client", server)  # the server is back, with its data
        assert index_catch_up() is True  # the beat task
        assert get_vector_index().cursor > cursor
        hits = search(api_client, "where is the production database?").json()["results"]
        assert hits[0]["item"]["point_id"] == during["point_id"]
        hits = search(api_client, "which region is the staging cluster in?").json()["results"]
        assert hits[0]["item"]["point_id"] == before["point_id"]
    finally:
        reset_vector_index()
