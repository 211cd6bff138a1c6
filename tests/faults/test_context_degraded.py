"""POST /memory/context with one backend down answers with the other part, marked degraded,
never a 5xx: Redis (working memory) stopped under a real gunicorn, and the vector index (a
Qdrant server) unreachable."""

import pytest
from qdrant_client import QdrantClient

from memory.vector_index import get_vector_index, reset_vector_index
from tests.faults.conftest import RedisServer, free_port, web_process

AGENT = "degraded"
MEMORY = "The staging cluster runs in eu-west-1."
QUERY = "which region does the staging cluster run in?"


def context_body(sid: str) -> dict:
    return {"agent_id": AGENT, "query": QUERY, "token_budget": 300, "session_id": sid}


@pytest.mark.django_db(transaction=True)
def test_with_redis_down_the_context_still_has_the_memories(
    api_key, tmp_path, redis_server: RedisServer
):
    url = redis_server.url
    with web_process(tmp_path, api_key[1], REDIS_URL=url, CELERY_BROKER_URL=url) as web:
        stored = web.call("POST", "/memory/store", {"agent_id": AGENT, "content": MEMORY})
        assert stored.status == 201, web.logs()
        turns = [{"role": "user", "content": "we are moving staging"}]
        start = web.call("POST", "/session/start", {"agent_id": AGENT, "messages": turns})
        sid = start.json()["session_id"]
        whole = web.call("POST", "/memory/context", context_body(sid)).json()
        assert whole["degraded"] == [] and len(whole["recent_turns"]) == 1

        redis_server.stop()

        answer = web.call("POST", "/memory/context", context_body(sid))
        assert answer.status == 200, (answer.body, web.logs())
        body = answer.json()
        assert body["degraded"] == ["working_memory"] and body["recent_turns"] == []
        assert [m["item"]["content"] for m in body["memories"]] == [MEMORY]
        assert body["context"].startswith("## Relevant memories\n")

        redis_server.start()
        assert web.call("POST", "/memory/context", context_body(sid)).json() == whole


@pytest.mark.django_db
def test_with_the_vector_index_down_the_context_still_has_the_recent_turns(
    api_client, settings, monkeypatch
):
    """No Qdrant server binary installs here: qdrant-client's in-process mode stands in for it,
    and the outage is its client swapped for one aimed at a closed port."""
    settings.QDRANT_URL = ":memory:"
    reset_vector_index()
    try:
        api_client.post("/memory/store", {"agent_id": AGENT, "content": MEMORY}, format="json")
        turns = [{"role": "user", "content": "we are moving staging"}]
        sid = api_client.post(
            "/session/start", {"agent_id": AGENT, "messages": turns}, format="json"
        ).json()["session_id"]
        engine = get_vector_index().engine
        down = QdrantClient(url=f"http://127.0.0.1:{free_port()}", timeout=1)
        monkeypatch.setattr(engine, "_client", down)

        answer = api_client.post("/memory/context", context_body(sid), format="json")
        assert answer.status_code == 200, answer.json()
        body = answer.json()
        assert body["degraded"] == ["vector_index"] and body["memories"] == []
        assert [t["content"] for t in body["recent_turns"]] == ["we are moving staging"]
        assert body["context"] == "## Recent turns\nuser: we are moving staging"
    finally:
        reset_vector_index()
