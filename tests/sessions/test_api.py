"""The session API: start, read, update, close, compress; scoping, limits, Redis down."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from memory.models import MemoryItem
from sessions.models import Consolidation, Session
from tests.sessions.conftest import AGENT, chat, client_for

pytestmark = pytest.mark.django_db


def start(client, **body):
    response = client.post("/session/start", {"agent_id": AGENT, **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def put(client, sid, body):
    return client.put(f"/session/{sid}", body, format="json")


def test_start_read_update(api_client, store_engine):
    state = start(api_client, task="Fix the flaky test", facts=["CI runs on 3.11"])
    assert state["version"] == 1 and state["messages"] == [] and state["status"] == "open"
    sid = state["session_id"]
    assert api_client.get(f"/session/{sid}").json() == state

    response = put(
        api_client,
        sid,
        {"version": 1, "append_messages": chat("first"), "scratchpad": "try -x", "step": 2},
    )
    assert response.status_code == 200, response.json()
    updated = response.json()
    assert updated["version"] == 2 and updated["step"] == 2 and updated["scratchpad"] == "try -x"
    assert [m["content"] for m in updated["messages"]] == ["first"]
    assert updated["facts"] == ["CI runs on 3.11"] and updated["task"] == "Fix the flaky test"
    assert updated["expires_at"] >= state["expires_at"]

    again = put(api_client, sid, {"version": 2, "append_messages": chat("second")}).json()
    assert [m["content"] for m in again["messages"]] == ["first", "second"]
    assert api_client.get(f"/session/{sid}").json() == again
    session = Session.objects.get(pk=sid)
    assert session.version == 3 and session.last_activity_at.isoformat() == again["updated_at"]


def test_a_stale_version_gets_409_with_the_current_one(api_client, store_engine):
    sid = start(api_client)["session_id"]
    assert put(api_client, sid, {"version": 1, "step": 1}).status_code == 200
    stale = put(api_client, sid, {"version": 1, "step": 5})
    assert stale.status_code == 409
    assert stale.json()["current_version"] == 2
    assert api_client.get(f"/session/{sid}").json()["step"] == 1


def test_version_is_required_and_input_is_validated(api_client):
    sid = start(api_client)["session_id"]
    response = put(api_client, sid, {"step": 1})
    assert response.status_code == 400 and "version" in response.json()
    bad = put(api_client, sid, {"version": "1", "append_messages": [{"role": "robot"}]})
    assert bad.status_code == 400
    assert set(bad.json()) == {"version", "append_messages"}
    assert api_client.post("/session/start", {}, format="json").status_code == 400


def test_over_size_state_gets_400_naming_the_field(api_client, settings, store_engine):
    settings.SESSION_MAX_STATE_BYTES = 5_000
    settings.SESSION_MAX_MESSAGES = 3
    sid = start(api_client)["session_id"]
    big = put(api_client, sid, {"version": 1, "append_messages": chat("x" * 6_000)})
    assert big.status_code == 400
    assert "SESSION_MAX_STATE_BYTES" in big.json()["append_messages"][0]
    many = put(api_client, sid, {"version": 1, "append_messages": chat("a", "b", "c", "d")})
    assert many.status_code == 400 and "at most 3" in many.json()["append_messages"][0]
    scratch = put(api_client, sid, {"version": 1, "scratchpad": "y" * 6_000})
    assert scratch.status_code == 400 and "scratchpad" in scratch.json()
    assert api_client.get(f"/session/{sid}").json()["version"] == 1  # nothing half-written
    huge_start = api_client.post(
        "/session/start", {"agent_id": AGENT, "task": "z" * 6_000}, format="json"
    )
    assert huge_start.status_code == 400 and "task" in huge_start.json()


def test_unknown_sessions_are_404(api_client):
    assert api_client.get(f"/session/{uuid.uuid4()}").status_code == 404
    assert api_client.get("/session/not-a-uuid").status_code == 404
    assert put(api_client, uuid.uuid4(), {"version": 1}).status_code == 404
    closing = api_client.post("/session/close", {"session_id": str(uuid.uuid4())}, format="json")
    assert closing.status_code == 404
    assert api_client.post(f"/memory/compress?session_id={uuid.uuid4()}").status_code == 404
    assert api_client.post("/memory/compress").status_code == 400


def test_close_answers_202_with_the_task_and_twice_is_harmless(
    api_client, store_engine, django_capture_on_commit_callbacks
):
    sid = start(api_client, task="Ship the release")["session_id"]
    put(api_client, sid, {"version": 1, "append_messages": chat("We decided to ship on Friday.")})
    with django_capture_on_commit_callbacks(execute=True):
        first = api_client.post("/session/close", {"session_id": sid}, format="json")
    assert first.status_code == 202, first.json()
    body = first.json()
    assert body["task_id"] and body["version"] == 2 and body["reason"] == "close"
    # The test settings run the task eagerly: it is done already.
    assert Consolidation.objects.get(pk=body["consolidation_id"]).status == "done"
    with django_capture_on_commit_callbacks(execute=True):
        second = api_client.post("/session/close", {"session_id": sid}, format="json")
    assert second.status_code == 202
    assert second.json()["task_id"] == body["task_id"]
    assert second.json()["consolidation_id"] == body["consolidation_id"]
    assert Consolidation.objects.filter(session_id=sid).count() == 1
    assert MemoryItem.objects.filter(session_id=sid).count() == 1  # the summary

    gone = api_client.get(f"/session/{sid}")
    assert gone.status_code == 410
    assert gone.json()["status"] == "closed" and gone.json()["closed_at"]
    assert gone.json()["summary_item_id"] == second.json()["summary_item_id"]
    assert put(api_client, sid, {"version": 2, "step": 1}).status_code == 410
    assert api_client.post(f"/memory/compress?session_id={sid}").status_code == 410


def test_an_expired_session_is_410_saying_when(api_client, store_engine):
    sid = start(api_client, ttl_seconds=60)["session_id"]
    past = timezone.now() - timedelta(seconds=1)
    Session.objects.filter(pk=sid).update(expires_at=past)
    gone = api_client.get(f"/session/{sid}")
    assert gone.status_code == 410
    assert gone.json()["status"] == "expired"
    assert gone.json()["expired_at"] == past.isoformat()
    closing = api_client.post("/session/close", {"session_id": sid}, format="json")
    assert closing.status_code == 410


def test_a_state_the_store_lost_is_410(api_client, store_engine):
    from sessions.working_memory import get_working_memory

    sid = start(api_client)["session_id"]
    get_working_memory().delete(session_id=sid)
    assert api_client.get(f"/session/{sid}").status_code == 410
    assert api_client.post("/session/close", {"session_id": sid}, format="json").status_code == 410


def test_compress_consolidates_without_closing_and_repeats_create_nothing(api_client, store_engine):
    sid = start(api_client, task="Migrate the billing DB", facts=["Billing runs PostgreSQL 16"])[
        "session_id"
    ]
    put(
        api_client,
        sid,
        {
            "version": 1,
            "append_messages": chat(
                "The migration script needs a maintenance window on Sunday night.",
                "Let's take a snapshot of the billing database before migrating.",
            ),
            "tool_state": {"calls": [{"name": "psql", "error": "connection refused"}]},
        },
    )
    first = api_client.post(f"/memory/compress?session_id={sid}")
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["status"] == "done" and body["reason"] == "compress"
    assert body["summary"].startswith("Task: Migrate the billing DB\nAda: ")
    items = MemoryItem.objects.filter(session_id=sid)
    assert {(i.kind, i.source) for i in items} == {
        ("session_summary", "consolidation"),
        ("semantic", "consolidation"),
        ("procedural", "consolidation"),
    }
    contents = {i.kind: i.content for i in items if i.kind != "semantic"}
    assert contents["procedural"] == "Tool psql failed: connection refused"
    semantic = {i.content for i in items if i.kind == "semantic"}
    assert "Billing runs PostgreSQL 16" in semantic
    # A session this short is kept whole: both turns are the summary's.
    assert len(semantic) == 1
    assert sorted(body["memory_item_ids"]) == sorted(str(i.pk) for i in items)
    count = MemoryItem.objects.count()

    again = api_client.post(f"/memory/compress?session_id={sid}")
    assert again.status_code == 200
    assert again.json()["consolidation_id"] == body["consolidation_id"]
    assert MemoryItem.objects.count() == count
    assert api_client.get(f"/session/{sid}").status_code == 200  # still open

    # A changed state is consolidated again; its summary replaces the earlier one.
    put(api_client, sid, {"version": 2, "outcome": "Migrated with 4 minutes of downtime."})
    third = api_client.post(f"/memory/compress?session_id={sid}")
    assert third.status_code == 201 and third.json()["version"] == 3
    summaries = MemoryItem.objects.filter(session_id=sid, kind="session_summary")
    assert [s.pk for s in summaries] == [uuid.UUID(third.json()["summary_item_id"])]
    assert "Outcome: Migrated with 4 minutes of downtime." in summaries[0].content


def test_the_summary_is_found_by_search(api_client):
    sid = start(api_client, task="Plan the trip")["session_id"]
    put(
        api_client,
        sid,
        {
            "version": 1,
            "append_messages": chat(
                "I booked a flight to Lisbon for the conference in March.",
                "The hotel near the venue costs 140 euros a night.",
                "ok",
            ),
        },
    )
    point = api_client.post(f"/memory/compress?session_id={sid}").json()["summary_item_id"]
    found = api_client.post(
        "/memory/search",
        {"agent_id": AGENT, "query": "Where is the conference flight going?", "limit": 3},
        format="json",
    ).json()["results"]
    assert found[0]["item"]["point_id"] == point
    assert found[0]["item"]["kind"] == "session_summary"
    assert found[0]["item"]["session_id"] == sid


def test_facts_are_deduplicated_against_the_agents_memory(api_client):
    stored = api_client.post(
        "/memory/store",
        {"agent_id": AGENT, "content": "The API key lives in Vault."},
        format="json",
    ).json()
    sid = start(api_client, facts=["the API key lives in vault."])["session_id"]
    body = api_client.post(f"/memory/compress?session_id={sid}").json()
    assert stored["point_id"] in body["memory_item_ids"]
    assert MemoryItem.objects.exclude(kind="session_summary").count() == 1
    assert MemoryItem.objects.get(pk=stored["point_id"]).access_count == 1


def test_a_key_limited_to_agents_never_touches_another_agents_sessions(api_client):
    other = start(api_client)["session_id"]  # AGENT's session, made by an unlimited key
    limited = client_for(allowed_agent_ids=["agent-b"])
    assert limited.post("/session/start", {"agent_id": AGENT}, format="json").status_code == 403
    assert limited.get(f"/session/{other}").status_code == 404
    assert put(limited, other, {"version": 1, "step": 3}).status_code == 404
    assert limited.post("/session/close", {"session_id": other}, format="json").status_code == 404
    assert limited.post(f"/memory/compress?session_id={other}").status_code == 404
    own = limited.post("/session/start", {"agent_id": "agent-b"}, format="json")
    assert own.status_code == 201
    assert api_client.get(f"/session/{other}").json()["step"] == 0
    assert Session.objects.get(pk=other).status == "open"


def test_a_read_only_key_reads_but_never_writes(api_client):
    sid = start(api_client)["session_id"]
    reader = client_for(read_only=True)
    assert reader.get(f"/session/{sid}").status_code == 200
    assert reader.post("/session/start", {"agent_id": AGENT}, format="json").status_code == 403
    assert put(reader, sid, {"version": 1, "step": 1}).status_code == 403
    assert reader.post("/session/close", {"session_id": sid}, format="json").status_code == 403
    assert reader.post(f"/memory/compress?session_id={sid}").status_code == 403
    assert api_client.get(f"/session/{sid}").json()["version"] == 1


def test_sessions_need_a_key(anon_client):
    assert anon_client.post("/session/start", {"agent_id": AGENT}, format="json").status_code == 401


def test_with_redis_down_sessions_are_503_and_the_rest_works(api_client, anon_client, settings):
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = api_client.post("/session/start", {"agent_id": AGENT}, format="json")
    assert response.status_code == 503
    assert (
        "Working memory is unavailable: Redis at redis://127.0.0.1:1/0"
        in (response.json()["detail"])
    )
    assert not Session.objects.exists()  # nothing half-written
    assert api_client.get(f"/session/{uuid.uuid4()}").status_code == 404  # DB answers first

    stored = api_client.post(
        "/memory/store", {"agent_id": AGENT, "content": "Redis is down today."}, format="json"
    )
    assert stored.status_code == 201
    search = api_client.post("/memory/search", {"agent_id": AGENT, "query": "redis"}, format="json")
    assert search.status_code == 200 and search.json()["results"]
    experience = {
        "agent_id": AGENT,
        "task": "t",
        "tool_calls": [],
        "test_result": {"passed": True, "total": 1, "failed": 0, "errors": 0},
        "reward": 1.0,
    }
    assert api_client.post("/experience/", experience, format="json").status_code == 201
    assert api_client.get("/experience/replay?batch_size=2").status_code == 200

    health = anon_client.get("/health")
    assert health.status_code == 503
    assert health.json()["failed"] == ["working_memory"]
    assert "Redis" in health.json()["backends"]["working_memory"]["error"]


def test_redis_down_on_a_live_session_is_503(api_client, settings, redis_url):
    settings.REDIS_URL = redis_url
    sid = start(api_client)["session_id"]
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert api_client.get(f"/session/{sid}").status_code == 503
    assert put(api_client, sid, {"version": 1}).status_code == 503
    assert api_client.post("/session/close", {"session_id": sid}, format="json").status_code == 503
    assert api_client.post(f"/memory/compress?session_id={sid}").status_code == 503
    assert Session.objects.get(pk=sid).status == "open"  # not closed without its state


def test_health_and_stats_report_the_working_memory(api_client, anon_client, store_engine):
    health = anon_client.get("/health").json()
    assert health["backends"]["working_memory"]["status"] == "ok"
    assert health["backends"]["working_memory"]["engine"] == store_engine
    start(api_client)
    stats = api_client.get("/stats").json()["sessions"]
    assert stats["count_by_status"] == {"open": 1} and stats["working_memory"] == store_engine
