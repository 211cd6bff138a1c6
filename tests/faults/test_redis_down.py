"""Redis stopped mid-run, with real processes: gunicorn configured as deployed with REDIS_URL
(working memory, the cache behind throttling, the Celery broker) pointed at a redis-server of
the test's own. Sessions answer 503 with a clear message while it is down, every other
endpoint works, and sessions work again when it is back on the same port."""

import pytest

from experience.models import Experience
from memory.models import MemoryItem
from sessions.models import Session
from tests.faults.conftest import RedisServer, web_process

AGENT = "faulty"


@pytest.mark.django_db(transaction=True)
def test_sessions_are_503_while_redis_is_down_and_recover_and_nothing_else_is_affected(
    api_key, tmp_path, redis_server: RedisServer
):
    url = redis_server.url
    with web_process(tmp_path, api_key[1], REDIS_URL=url, CELERY_BROKER_URL=url) as web:
        start = web.call("POST", "/session/start", {"agent_id": AGENT, "task": "survive"})
        assert start.status == 201, web.logs()
        sid = start.json()["session_id"]
        put = web.call("PUT", f"/session/{sid}", {"version": 1, "scratchpad": "before"})
        assert put.status == 200, put.body

        redis_server.stop()

        for method, path, body in (
            ("GET", f"/session/{sid}", None),
            ("PUT", f"/session/{sid}", {"version": 2, "scratchpad": "during"}),
            ("POST", "/session/start", {"agent_id": AGENT}),
        ):
            down = web.call(method, path, body)
            assert down.status == 503, (method, path, down.body, web.logs())
            assert down.content_type == "application/json"
            detail = down.json()["detail"]
            assert detail.startswith(f"Working memory is unavailable: Redis at {url}")
            assert "memory and experience endpoints are not affected" in detail
        assert Session.objects.count() == 1  # the refused start wrote nothing

        # Everything else answers as usual (the throttle's cache is that Redis too).
        stored = web.call(
            "POST",
            "/experience/",
            {"id": "exp-during-outage", "agent_id": AGENT, "task": "t", "reward": 1.0},
        )
        assert stored.status == 201, (stored.body, web.logs())
        replay = web.call("GET", f"/experience/replay?agent_id={AGENT}&batch_size=4")
        assert replay.status == 200, replay.body  # its draws are counted without the broker
        assert replay.json()["items"][0]["experience"]["id"] == "exp-during-outage"
        assert web.call("GET", "/experience/stats").status == 200
        assert web.call("GET", "/stats").status == 200
        memory = web.call(
            "POST", "/memory/store", {"agent_id": AGENT, "content": "Redis went down at noon."}
        )
        assert memory.status == 201, memory.body
        found = web.call(
            "POST", "/memory/search", {"agent_id": AGENT, "query": "when did Redis go down?"}
        )
        assert found.status == 200, found.body
        assert found.json()["results"][0]["item"]["point_id"] == memory.json()["point_id"]
        health = web.call("GET", "/health")
        assert health.status == 503
        assert health.json()["backends"]["working_memory"]["status"] == "error"

        redis_server.start()  # the same port; its append-only file brings the session back

        assert web.call("GET", f"/session/{sid}").json()["scratchpad"] == "before"
        again = web.call("PUT", f"/session/{sid}", {"version": 2, "scratchpad": "after"})
        assert again.status == 200, again.body
        assert again.json()["version"] == 3
        assert web.call("POST", "/session/start", {"agent_id": AGENT}).status == 201
        assert web.call("GET", "/health").status == 200
    assert Experience.objects.filter(experience_id="exp-during-outage").count() == 1
    assert MemoryItem.objects.filter(agent_id=AGENT).count() == 1
