import json
import math
import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.db import DatabaseError
from kombu import Connection

from experience import services
from experience.models import Experience
from experience.services import experience_mark_sampled_flush, priority_from_td_error
from experience.tasks import mark_sampled
from ferrum_memory.celery import app as celery_app
from ferrum_memory.core.services import api_key_create
from tests.experience.factories import experience_json, experience_jsons, store

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def test_post_one_stores_it_at_max_priority(api_client):
    payload = experience_json()
    response = api_client.post("/experience/", payload, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["id"] == payload["id"]
    assert body["tool_calls"][0]["name"] == payload["tool_calls"][0]["name"]
    assert body["passed"] == payload["test_result"]["passed"]
    assert body["priority"] == 1.0 and body["td_error"] is None and body["times_sampled"] == 0
    assert body["expires_at"] is not None


def test_post_without_slash_works_too(api_client):
    assert api_client.post("/experience", experience_json(), format="json").status_code == 201


def test_new_items_get_the_agents_current_max_priority(api_client):
    store(td_error=3.0)
    top = priority_from_td_error(3.0)
    body = api_client.post("/experience/", experience_json(), format="json").json()
    assert body["priority"] == pytest.approx(top)
    other_agent = experience_json(agent_id="agent-b")
    assert api_client.post("/experience/", other_agent, format="json").json()["priority"] == 1.0


def test_retry_with_the_same_id_returns_the_stored_row(api_client):
    payload = experience_json()
    first = api_client.post("/experience/", payload, format="json").json()
    retry = api_client.post("/experience/", {**payload, "reward": 0.123}, format="json")
    assert retry.status_code == 200
    assert retry.json() == first
    assert Experience.objects.count() == 1


def test_id_of_another_agent_is_a_conflict_and_writes_nothing(api_client):
    store(id="taken", agent_id="agent-b")
    batch = [experience_json(), experience_json(id="taken")]
    response = api_client.post("/experience/", batch, format="json")
    assert response.status_code == 409
    assert response.json()["experience_id"] == "taken"
    assert Experience.objects.count() == 1


def test_post_a_list_stores_all_and_reports_retries(api_client):
    batch = experience_jsons(3)
    response = api_client.post("/experience/", batch, format="json")
    assert response.status_code == 201
    assert response.json() == {
        "created": 3,
        "existing": 0,
        "items": [{"id": p["id"], "created": True} for p in batch],
    }
    newcomer = experience_json()
    del newcomer["id"]
    again = api_client.post("/experience/", [batch[1], newcomer, batch[0]], format="json")
    assert again.status_code == 201
    body = again.json()
    assert (body["created"], body["existing"]) == (1, 2)
    assert [item["created"] for item in body["items"]] == [False, True, False]
    assert [body["items"][i]["id"] for i in (0, 2)] == [batch[1]["id"], batch[0]["id"]]
    stored = Experience.objects.get(experience_id=body["items"][1]["id"])
    assert stored.task == newcomer["task"]
    assert Experience.objects.count() == 4


def test_a_list_of_known_ids_is_200_and_changes_nothing(api_client):
    batch = experience_jsons(2)
    api_client.post("/experience/", batch, format="json")
    again = api_client.post("/experience/", [{**p, "reward": 0.5} for p in batch], format="json")
    assert again.status_code == 200
    assert again.json()["existing"] == 2
    assert sorted(Experience.objects.values_list("reward", flat=True)) == sorted(
        p["reward"] for p in batch
    )


def test_a_list_is_stored_whole_and_sampled_from_the_next_request(api_client):
    # On PostgreSQL a list goes in by COPY with ids taken from the table's sequence.
    first = api_client.post("/experience/", experience_jsons(3, td_error=1.0), format="json")
    single = api_client.post("/experience/", experience_json(), format="json").json()
    ids = [item["id"] for item in first.json()["items"]] + [single["id"]]
    rows = {row.experience_id: row for row in Experience.objects.all()}
    assert sorted(rows) == sorted(ids) and len({row.pk for row in rows.values()}) == 4
    row = rows[ids[0]]
    detail = api_client.get(f"/experience/{row.experience_id}").json()
    assert detail["tool_calls"] == row.tool_calls and detail["test_result"] == row.test_result
    replay = api_client.get("/experience/replay", {"batch_size": 64, "seed": 2}).json()
    assert {item["experience"]["id"] for item in replay["items"]} == set(ids)
    # Replay writes the JSON columns as stored; what it shows is what GET shows, indented too.
    query = {"batch_size": 64, "seed": 2}
    indented = api_client.get("/experience/replay", query, HTTP_ACCEPT="application/json; indent=2")
    assert indented.status_code == 200 and indented.content.startswith(b'{\n  "strategy"')

    def uncounted(experience: dict) -> dict:  # each request counts its draws
        return {
            k: v for k, v in experience.items() if k not in ("times_sampled", "last_sampled_at")
        }

    again = indented.json()["items"]
    assert [uncounted(i["experience"]) for i in again] == [
        uncounted(i["experience"]) for i in replay["items"]
    ]
    for item in replay["items"]:
        shown = api_client.get(f"/experience/{item['experience']['id']}").json()
        assert uncounted(item["experience"]) == uncounted(shown)


def test_server_assigns_an_id_when_none_is_sent(api_client):
    payload = experience_json()
    del payload["id"]
    body = api_client.post("/experience/", payload, format="json").json()
    assert len(body["id"]) == 32


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reward": "1.0"}, "reward"),
        ({"reward": True}, "reward"),
        ({"reward": None}, "reward"),
        ({"td_error": "0.5"}, "td_error"),
        ({"task": "x" * 20_001}, "task"),
        ({"agent_id": "a" * 257}, "agent_id"),
        ({"id": "i" * 257}, "id"),
        ({"id": "has space"}, "id"),
        ({"id": "stats"}, "id"),
        ({"test_result": {"passed": "yes"}}, "test_result"),
        ({"test_result": {"passed": True, "total": -1}}, "test_result"),
        ({"test_result": {"passed": True, "total": 1.5}}, "test_result"),
        ({"tool_calls": [{"arguments": {}}]}, "tool_calls"),
        ({"tool_calls": [{"name": "t", "duration_ms": -1}]}, "tool_calls"),
        ({"tool_calls": "not a list"}, "tool_calls"),
        ({"metadata": {"blob": "x" * 70_000}}, "metadata"),
        ({"ttl_seconds": -5}, "ttl_seconds"),
    ],
)
def test_bad_input_gets_400_with_the_field_and_writes_nothing(api_client, change, field):
    batch = [experience_json(), experience_json(**change)]
    response = api_client.post("/experience/", batch, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["1"], response.json()
    assert Experience.objects.count() == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_get_400(api_client, literal):
    body = json.dumps(experience_json(reward=0.0)).replace('"reward": 0.0', f'"reward": {literal}')
    response = api_client.generic("POST", "/experience/", body, content_type="application/json")
    assert response.status_code == 400
    assert Experience.objects.count() == 0


def test_malformed_json_gets_json_400(api_client):
    response = api_client.generic(
        "POST", "/experience/", "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_lists_over_1000_or_empty_are_refused(api_client):
    assert api_client.post("/experience/", [], format="json").status_code == 400
    batch = experience_jsons(1001)
    assert api_client.post("/experience/", batch, format="json").status_code == 400
    assert Experience.objects.count() == 0


def test_an_id_repeated_in_one_list_is_one_experience_sent_again(api_client):
    """As a retry in a later request: the first is stored, the repeat answers it. (A 400 for
    it was a rule the schema could not state: schemathesis found a list of two alike items,
    valid by the schema, refused.)"""
    first, repeat = experience_json(id="same", reward=1.0), experience_json(id="same", reward=2.0)
    response = api_client.post("/experience/", [first, experience_json(), repeat], format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["created"], body["existing"]) == (2, 1)
    assert [item["created"] for item in body["items"]] == [True, True, False]
    assert Experience.objects.get(experience_id="same").reward == 1.0
    assert Experience.objects.count() == 2


def test_an_id_repeated_in_one_list_for_another_agent_is_a_conflict(api_client):
    batch = [experience_json(id="same"), experience_json(id="same", agent_id="agent-b")]
    response = api_client.post("/experience/", batch, format="json")
    assert response.status_code == 409 and response.json()["experience_id"] == "same"
    assert Experience.objects.count() == 0


def test_get_list_and_delete(api_client):
    rows = [store(agent_id="agent-a"), store(agent_id="agent-b"), store(agent_id="agent-a")]
    body = api_client.get("/experience/", {"agent_id": "agent-a"}).json()
    assert [item["id"] for item in body["results"]] == [
        rows[2].experience_id,
        rows[0].experience_id,
    ]
    page = api_client.get("/experience/", {"page_size": 2}).json()
    assert len(page["results"]) == 2 and page["next"]
    assert len(api_client.get(page["next"]).json()["results"]) == 1

    detail = api_client.get(f"/experience/{rows[0].experience_id}")
    assert detail.status_code == 200 and detail.json()["agent_id"] == "agent-a"
    assert api_client.delete(f"/experience/{rows[0].experience_id}").status_code == 204
    assert api_client.get(f"/experience/{rows[0].experience_id}").status_code == 404
    assert api_client.delete(f"/experience/{rows[0].experience_id}").status_code == 404


def test_list_filters_on_passed_and_sampled(api_client):
    store(test_result={"passed": True})
    failed = store(test_result={"passed": False})
    Experience.objects.filter(pk=failed.pk).update(times_sampled=2)
    ids = lambda **q: [i["id"] for i in api_client.get("/experience/", q).json()["results"]]  # noqa: E731
    assert ids(passed="false") == [failed.experience_id]
    assert ids(sampled="true") == [failed.experience_id]
    assert len(ids(sampled="false")) == 1


def test_td_error_update_one_and_many(api_client):
    a, b = store(), store()
    response = api_client.put(
        "/experience/td-error", {"experience_id": a.experience_id, "td_error": -2.5}, format="json"
    )
    assert response.status_code == 200 and response.json() == {"updated": 1, "unknown_ids": []}
    a.refresh_from_db()
    assert a.td_error == -2.5
    assert a.priority == pytest.approx((2.5 + settings.REPLAY_EPSILON) ** settings.REPLAY_ALPHA)

    updates = [
        {"experience_id": b.experience_id, "td_error": 0.5},
        {"experience_id": "ghost", "td_error": 1},
    ]
    response = api_client.put("/experience/td-error", {"updates": updates}, format="json")
    assert response.json() == {"updated": 1, "unknown_ids": ["ghost"]}
    b.refresh_from_db()
    assert b.td_error == 0.5


def test_td_error_for_an_unknown_id_is_reported_like_in_a_batch(api_client):
    response = api_client.put(
        "/experience/td-error", {"experience_id": "ghost", "td_error": 1.0}, format="json"
    )
    assert response.status_code == 200
    assert response.json() == {"updated": 0, "unknown_ids": ["ghost"]}


@pytest.mark.parametrize(
    "body",
    [
        {"updates": [{"experience_id": "x", "td_error": 1.0}] * 10_001},
        {"updates": []},
        {"experience_id": "x", "td_error": "1"},
        {"experience_id": "x"},
    ],
)
def test_bad_td_error_updates_get_400_and_write_nothing(api_client, body):
    row = store(td_error=0.1)
    response = api_client.put("/experience/td-error", body, format="json")
    assert response.status_code == 400
    row.refresh_from_db()
    assert row.td_error == 0.1


def test_infinite_td_error_gets_400(api_client):
    row = store(td_error=0.1)
    body = f'{{"experience_id": "{row.experience_id}", "td_error": 1e999}}'
    response = api_client.generic(
        "PUT", "/experience/td-error", body, content_type="application/json"
    )
    # A number beyond a double is a parse error (orjson), like NaN and Infinity.
    assert response.status_code == 400
    assert response.json()["detail"].startswith("JSON parse error - number is infinity")
    row.refresh_from_db()
    assert row.td_error == 0.1


def test_stats_summarise_the_buffer(api_client):
    rows = [
        store(agent_id="a", td_error=0.5),
        store(agent_id="a"),
        store(agent_id="b", td_error=-2.0),
    ]
    Experience.objects.filter(pk=rows[0].pk).update(times_sampled=3)
    body = api_client.get("/experience/stats").json()
    rewards = [r.reward for r in rows]
    assert body["count"] == 3 and body["count_by_agent"] == {"a": 2, "b": 1}
    assert body["reward"]["mean"] == pytest.approx(statistics.fmean(rewards))
    assert body["reward"]["std"] == pytest.approx(statistics.pstdev(rewards))
    assert body["reward"]["min"] == min(rewards) and body["reward"]["max"] == max(rewards)
    passed = [bool(r.passed) for r in rows]
    assert body["pass_rate"] == pytest.approx(sum(passed) / len(passed))
    assert body["td_error"] == {"count": 2, "abs_mean": 1.25, "min": -2.0, "max": 0.5}
    assert body["priority"]["max"] == pytest.approx(max(r.priority for r in rows))
    assert body["times_sampled"] == 3 and body["never_sampled"] == 2
    assert body["oldest"] <= body["newest"]


def test_stats_of_an_empty_buffer(api_client):
    body = api_client.get("/experience/stats").json()
    assert body["count"] == 0 and body["pass_rate"] is None and body["times_sampled"] == 0


def test_replay_returns_items_with_probability_and_weight(api_client):
    for _ in range(5):
        store()
    response = api_client.get("/experience/replay", {"batch_size": 8, "seed": 1})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["strategy"] == "prioritized" and body["buffer_size"] == 5
    assert len(body["items"]) == 8
    for item in body["items"]:
        assert item["probability"] == pytest.approx(0.2)
        assert item["weight"] == pytest.approx(1.0)
    again = api_client.get("/experience/replay", {"batch_size": 8, "seed": 1}).json()
    assert [i["experience"]["id"] for i in again["items"]] == [
        i["experience"]["id"] for i in body["items"]
    ]
    assert sum(Experience.objects.values_list("times_sampled", flat=True)) == 16


def test_replay_leaves_counting_its_draws_to_a_worker(api_client, send_tasks_to):
    row, other = store(), store(agent_id="agent-b")
    send_tasks_to("memory://")  # a broker in this process, to read the task back
    for agent in ("agent-a", "agent-a", "agent-b"):
        response = api_client.get("/experience/replay", {"batch_size": 8, "agent_id": agent})
        assert response.status_code == 200
    experience_mark_sampled_flush()
    row.refresh_from_db()
    assert row.times_sampled == 0  # nothing written on the request path

    with celery_app.connection_for_read() as connection:
        queue = connection.SimpleQueue("celery")
        message = queue.get(timeout=5)
        assert queue.qsize() == 0  # the three requests' draws went in one task
    assert message.headers["task"] == "experience.mark_sampled"
    (pks, at), _, _ = message.decode()
    assert sorted(pks) == sorted([row.pk] * 16 + [other.pk] * 8)
    mark_sampled(pks, at)  # what the worker does with it (test_dream_e2e runs a real one)
    row.refresh_from_db()
    assert row.times_sampled == 16 and row.last_sampled_at == datetime.fromisoformat(at)


@pytest.mark.parametrize("trigger", ["interval", "size"])
def test_the_tally_reaches_the_broker_on_its_own(api_client, send_tasks_to, monkeypatch, trigger):
    """The tally's thread publishes without an explicit flush: after DRAW_FLUSH_SECONDS, or
    at once past DRAW_FLUSH_MAX draws."""
    row = store()
    send_tasks_to("memory://")
    if trigger == "interval":
        monkeypatch.setattr(services, "DRAW_FLUSH_SECONDS", 0.05)
    else:
        monkeypatch.setattr(services, "DRAW_FLUSH_MAX", 8)
    assert api_client.get("/experience/replay", {"batch_size": 8}).status_code == 200
    with celery_app.connection_for_read() as connection:
        message = connection.SimpleQueue("celery").get(timeout=30)  # polls until it is there
    (pks, _), _, _ = message.decode()
    assert pks == [row.pk] * 8


def test_the_tally_is_flushed_when_the_process_exits(tmp_path):
    """A web process that stops (gunicorn's graceful stop ends in sys.exit) publishes the
    draws its thread has not flushed yet."""
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    script = (
        "import django; django.setup()\n"
        "from experience.services import experience_mark_sampled_later\n"
        "experience_mark_sampled_later(pks=[7, 7, 9])\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ferrum_memory.settings.base",
        "FERRUM_DATA_DIR": str(tmp_path),
        "CELERY_BROKER_URL": broker,
    }
    env.pop("DATABASE_URL", None)  # publishing needs no database
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=120)
    with Connection(broker) as connection:
        message = connection.SimpleQueue("celery").get(timeout=10)
    assert message.headers["task"] == "experience.mark_sampled"
    (pks, _), _, _ = message.decode()
    assert pks == [7, 7, 9]


def test_replay_counts_its_draws_itself_when_the_broker_is_down(api_client, send_tasks_to, caplog):
    store()
    send_tasks_to("redis://127.0.0.1:1/0")  # nothing listens there
    response = api_client.get("/experience/replay", {"batch_size": 8})
    assert response.status_code == 200
    experience_mark_sampled_flush()
    assert Experience.objects.get().times_sampled == 8
    assert "the broker refused the task" in caplog.text


def test_replay_answers_even_when_its_draws_cannot_be_counted(
    api_client, send_tasks_to, monkeypatch, caplog
):
    # A database that serves the read and fails the write cannot be arranged here: patched.
    def fail(**kwargs):
        raise DatabaseError("disk full")

    monkeypatch.setattr("experience.services.experience_mark_sampled", fail)
    store()
    send_tasks_to("redis://127.0.0.1:1/0")
    assert api_client.get("/experience/replay", {"batch_size": 8}).status_code == 200
    experience_mark_sampled_flush()
    assert "8 replay draws went uncounted" in caplog.text


def test_a_redelivered_count_counts_again():
    # At least once, by choice (see experience.tasks.mark_sampled): a task run twice after a
    # worker was lost between commit and ack counts its draws twice.
    row = store()
    for _ in range(2):
        mark_sampled([row.pk, row.pk], "2026-01-02T03:04:05+00:00")
    row.refresh_from_db()
    assert row.times_sampled == 4


def test_replay_below_min_size_is_409_with_a_clear_message(api_client):
    store()
    response = api_client.get("/experience/replay", {"min_size": 5})
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "Not enough experiences to sample: the buffer holds 1 sampleable, min_size is 5."
    )
    assert api_client.get("/experience/replay", {"agent_id": "nobody"}).status_code == 409


@pytest.mark.parametrize(
    "query",
    [
        {"strategy": "greedy"},
        {"batch_size": 0},
        {"batch_size": 4097},
        {"batch_size": "many"},
        {"alpha": "nan"},
        {"beta": 2},
        {"half_life": 0},
        {"min_size": 0},
    ],
)
def test_bad_replay_queries_get_400(api_client, query):
    store()
    response = api_client.get("/experience/replay", query)
    assert response.status_code == 400
    assert set(query) & set(response.json()), response.json()


def test_agent_limited_key_stays_in_its_agents(api_client):
    theirs = store(agent_id="agent-b")
    _, raw = api_key_create(name="limited", allowed_agent_ids=["agent-a"])
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    mine = experience_json(agent_id="agent-a")
    assert api_client.post("/experience/", mine, format="json").status_code == 201
    assert (
        api_client.post(
            "/experience/", experience_json(agent_id="agent-b"), format="json"
        ).status_code
        == 403
    )
    assert api_client.get(f"/experience/{theirs.experience_id}").status_code == 404
    assert api_client.delete(f"/experience/{theirs.experience_id}").status_code == 404
    listed = api_client.get("/experience/").json()["results"]
    assert [item["id"] for item in listed] == [mine["id"]]
    assert api_client.get("/experience/stats").json()["count_by_agent"] == {"agent-a": 1}
    update = {"experience_id": theirs.experience_id, "td_error": 9.0}
    answer = api_client.put("/experience/td-error", update, format="json").json()
    assert answer == {"updated": 0, "unknown_ids": [theirs.experience_id]}
    replay = api_client.get("/experience/replay", {"batch_size": 4}).json()
    assert {i["experience"]["agent_id"] for i in replay["items"]} == {"agent-a"}
    assert api_client.get("/experience/replay", {"agent_id": "agent-b"}).status_code == 403
    # Trying the other agent's id gets 409, not its row: the id is taken, and nothing leaks.
    taken = experience_json(id=theirs.experience_id, agent_id="agent-a")
    response = api_client.post("/experience/", taken, format="json")
    assert response.status_code == 409 and "task" not in response.json()


def test_key_limited_to_several_agents_must_name_one_for_replay(api_client):
    store(agent_id="agent-a")
    _, raw = api_key_create(name="two", allowed_agent_ids=["agent-a", "agent-b"])
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/experience/replay").status_code == 400
    assert api_client.get("/experience/replay", {"agent_id": "agent-a"}).status_code == 200


def test_read_only_key_can_read_but_not_write(api_client):
    store()
    _, raw = api_key_create(name="ro", read_only=True)
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/experience/stats").status_code == 200
    assert api_client.post("/experience/", experience_json(), format="json").status_code == 403
    assert api_client.put("/experience/td-error", {"updates": []}, format="json").status_code == 403


def test_strict_float_rejects_non_finite_directly():
    from ferrum_memory.core.fields import StrictFloatField

    field = StrictFloatField()
    for bad in (math.nan, math.inf, "1", True, None):
        with pytest.raises(Exception, match="finite number"):
            field.to_internal_value(bad)
    assert field.to_internal_value(2) == 2.0


def test_a_whole_number_float_is_an_integer_and_tool_call_arguments_may_be_null(api_client):
    # JSON Schema counts 60.0 as an integer, and the schema allows null arguments: a client
    # generated from the schema may send either.
    body = experience_json(ttl_seconds=60.0)
    body["tool_calls"] = [{"name": "ls", "arguments": None}]
    response = api_client.post("/experience/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["tool_calls"][0]["arguments"] is None
    halves = experience_json(ttl_seconds=60.5)
    assert api_client.post("/experience/", halves, format="json").status_code == 400
    assert api_client.post("/experience/", [halves], format="json").status_code == 400
