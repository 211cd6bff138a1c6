"""DELETE /agents/{agent_id}: everything of one agent goes, provably, and nothing of another.

The marker test puts a unique string everywhere an agent's data can go, erases the agent, and
looks for the string in every API answer, every database row, every file under the data
folders (SQLite) and every Redis key (when the run has Redis)."""

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from agents.models import AgentErasure
from experience.dream_services import dream_cycle_claim, dream_cycle_run
from experience.models import DreamCycle, Experience
from ferrum_memory.core.services import api_key_create
from memory.embeddings import get_embedder
from memory.models import MemoryEvent, MemoryItem, WordPieceCounts
from memory.services import memory_count_word_pieces
from sessions.models import Consolidation, Session

OTHER = "agent-kept"


def client_for(**key: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='eraser', **key)[1]}")
    return client


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.content
    return response.json()


def seed(client: APIClient, agent_id: str, word: str) -> dict[str, Any]:
    """`word` in every place an agent's data can go: a memory and its history, an open
    session's message, a closed session's consolidation, an experience's id, task and tool
    output, and a dream cycle (its draws name the experience; its learner is `word`)."""
    stored = ok(
        client.post(
            "/memory/store",
            {"agent_id": agent_id, "content": f"The code word is {word}.", "metadata": {"w": word}},
            format="json",
        ),
        201,
    )
    ok(
        client.patch(
            f"/memory/{stored['point_id']}",
            {"version": 1, "content": f"The code word was {word}, it changed."},
            format="json",
        )
    )
    message = {"role": "user", "content": f"Remember {word} for the release on Friday."}
    sessions = []
    for _ in range(2):
        session = ok(
            client.post(
                "/session/start",
                {"agent_id": agent_id, "task": f"ship {word}", "messages": [message]},
                format="json",
            ),
            201,
        )
        sessions.append(session["session_id"])
    ok(client.post("/session/close", {"session_id": sessions[1]}, format="json"), 202)
    experience_id = f"exp-{word}"
    ok(
        client.post(
            "/experience/",
            {
                "id": experience_id,
                "agent_id": agent_id,
                "task": f"Fix {word}",
                "tool_calls": [{"name": "run", "output": f"printed {word}"}],
                "reward": 1.0,
            },
            format="json",
        ),
        201,
    )
    dream_cycle_run(agent_id=agent_id, seed=1)
    assert dream_cycle_claim(agent_id=agent_id, learner=word) is not None
    return {"point_id": stored["point_id"], "sessions": sessions, "experience_id": experience_id}


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def rows_with(marker: str) -> list[str]:
    """Every table whose rows hold `marker`, read as the database holds them."""
    found = []
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {quote(table)}")
            if any(marker.encode() in _as_bytes(v) for row in cursor.fetchall() for v in row):
                found.append(table)
    return found


def files_with(marker: str, *folders: Path) -> list[str]:
    return [
        str(path)
        for folder in folders
        for path in folder.rglob("*")
        if path.is_file() and marker.encode() in path.read_bytes()
    ]


def _redis_values(client: redis.Redis, key: Any) -> list[Any]:
    kind = _as_bytes(client.type(key))
    if kind == b"string":
        return [client.get(key)]
    if kind == b"hash":
        return [part for pair in client.hgetall(key).items() for part in pair]
    if kind == b"list":
        return list(client.lrange(key, 0, -1))
    if kind == b"set":
        return list(client.smembers(key))
    if kind == b"zset":
        return list(client.zrange(key, 0, -1))
    raise AssertionError(f"a Redis value of type {kind!r} is not checked")


def redis_keys_with(marker: str) -> list[str]:
    if not settings.REDIS_URL:
        return []
    client = redis.Redis.from_url(settings.REDIS_URL)
    found = []
    for key in client.scan_iter():
        values = _redis_values(client, key)
        if any(marker.encode() in _as_bytes(v) for v in [key, *values]):
            found.append(_as_bytes(key).decode())
    return found


def piece_counts() -> np.ndarray:
    """The word pieces' counts as the DB holds them (the IDF of a query's tokens)."""
    return np.frombuffer(bytes(WordPieceCounts.objects.get().counts), dtype="<i4")


def counted_afresh(items: Any) -> np.ndarray:
    """How many of `items` hold each word piece, counted here."""
    embedder = get_embedder()
    pieces = embedder.piece_ids(list(items.values_list("content", flat=True)))
    held = np.concatenate([np.unique(ids) for ids in pieces])
    return np.bincount(held, minlength=embedder.vocabulary_size)


def answers(client: APIClient, agent_id: str, data: dict[str, Any]) -> list[bytes]:
    """What the API tells about the agent, by every read route. (The experience's own id holds
    the marker, and a 404 names the id asked for: that answer is checked by its status.)"""
    responses = [
        client.get("/memory/", {"agent_id": agent_id}),
        client.post("/memory/search", {"agent_id": agent_id, "query": "code word"}, format="json"),
        client.get(f"/memory/{data['point_id']}"),
        client.get(f"/memory/{data['point_id']}/history"),
        *(client.get(f"/session/{sid}") for sid in data["sessions"]),
        client.get("/experience/", {"agent_id": agent_id}),
        client.get("/experience/replay", {"agent_id": agent_id}),
        client.get("/dream/cycles/", {"agent_id": agent_id}),
        client.get("/stats"),
    ]
    return [response.content for response in responses]


def other_agent(client: APIClient) -> dict[str, Any]:
    search = client.post("/memory/search", {"agent_id": OTHER, "query": "code word"}, format="json")
    return {
        "search": [(hit["item"]["point_id"], hit["score"]) for hit in search.json()["results"]],
        "memory": list(MemoryItem.objects.filter(agent_id=OTHER).values().order_by("pk")),
        "events": list(MemoryEvent.objects.filter(agent_id=OTHER).values().order_by("pk")),
        "experience": list(Experience.objects.filter(agent_id=OTHER).values().order_by("pk")),
        "sessions": list(Session.objects.filter(agent_id=OTHER).values().order_by("pk")),
        "consolidations": list(
            Consolidation.objects.filter(session__agent_id=OTHER).values().order_by("pk")
        ),
        "cycles": list(DreamCycle.objects.filter(agent_id=OTHER).values().order_by("pk")),
    }


@pytest.mark.django_db(transaction=True)
def test_erasure_leaves_no_trace_of_the_agent_and_touches_no_other(engines):
    marker = f"zq{uuid.uuid4().hex[:12]}"
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    client = client_for()
    data = seed(client, agent, marker)
    seed(client, OTHER, "kept")
    before = other_agent(client)
    database_folder = Path(connection.settings_dict["NAME"]).parent
    sqlite = connection.vendor == "sqlite"
    # The marker is there to be found: each check below could fail.
    assert len(rows_with(marker)) >= 5
    assert not sqlite or files_with(marker, database_folder)
    assert not settings.REDIS_URL or redis_keys_with(marker)
    assert any(marker.encode() in body for body in answers(client, agent, data))
    memory_count_word_pieces()  # as the beat does: the agent's items are counted
    assert (piece_counts() != counted_afresh(MemoryItem.objects.exclude(agent_id=agent))).any()

    erased = ok(client.delete(f"/agents/{agent}"))

    assert erased["erased_now"] is True and erased["actor"] == "eraser"
    assert erased["counts"] == {
        "sessions": 2,
        "consolidations": 1,
        "memory_items": 2,  # the patched one, and the closed session's summary
        "memory_events": 3,
        "experiences": 1,
        "dream_cycles": 1,
        "dream_cycle_items": erased["counts"]["dream_cycle_items"],
    }
    assert erased["counts"]["dream_cycle_items"] >= 1
    assert not [body for body in answers(client, agent, data) if marker.encode() in body]
    assert client.get(f"/experience/{data['experience_id']}").status_code == 404
    assert rows_with(marker) == []
    assert rows_with(agent) == [
        "agents_agenterasure",
        "experience_experiencetombstone",
        "memory_memorytombstone",
    ]
    if sqlite:  # PostgreSQL keeps freed tuples until VACUUM: see the README
        assert files_with(marker, database_folder, engines) == []
    assert redis_keys_with(marker) == []
    assert (piece_counts() == counted_afresh(MemoryItem.objects.all())).all()  # counted again
    assert other_agent(client) == before
    record = AgentErasure.objects.get(agent_id=agent)
    assert record.counts == erased["counts"] and marker not in str(record.counts)

    again = ok(client.delete(f"/agents/{agent}"))
    assert again["erased_now"] is False and again["counts"] == erased["counts"]
    assert AgentErasure.objects.filter(agent_id=agent).count() == 1


@pytest.mark.django_db
def test_only_a_writing_key_for_the_agent_may_erase_it(engines):
    seeded = seed(client_for(), OTHER, "kept")
    before = other_agent(client_for())
    for key in ({"allowed_agent_ids": ["agent-own"]}, {"read_only": True}):
        response = client_for(**key).delete(f"/agents/{OTHER}")
        assert response.status_code == 403, response.content
    assert other_agent(client_for()) == before and not AgentErasure.objects.exists()
    items = MemoryItem.objects.filter(agent_id=OTHER).count()
    own = ok(client_for(allowed_agent_ids=[OTHER]).delete(f"/agents/{OTHER}"))
    assert own["counts"]["memory_items"] == items >= 1
    assert client_for().get(f"/memory/{seeded['point_id']}").status_code == 404


@pytest.mark.django_db
def test_an_unknown_agent_is_erased_with_zero_counts_once(engines):
    first = ok(client_for().delete("/agents/nobody"))
    assert first["erased_now"] is True and not any(first["counts"].values())
    assert ok(client_for().delete("/agents/nobody"))["erased_now"] is False
    assert AgentErasure.objects.count() == 1
    too_long = client_for().delete(f"/agents/{'a' * 257}")
    assert too_long.status_code == 400 and "agent_id" in too_long.json()


@pytest.mark.django_db
def test_the_admin_erases_an_agent_and_shows_the_records_read_only(engines, admin_client):
    seeded = seed(client_for(), OTHER, "kept")
    page = admin_client.get("/admin/agents/agenterasure/add/")
    assert page.status_code == 200 and b"cannot be undone" in page.content
    response = admin_client.post("/admin/agents/agenterasure/add/", {"agent_id": OTHER})
    assert response.status_code == 302, response.content
    record = AgentErasure.objects.get()
    assert record.actor == "admin:admin" and record.counts["experiences"] == 1
    assert not MemoryItem.objects.filter(agent_id=OTHER).exists()
    assert client_for().get(f"/memory/{seeded['point_id']}").status_code == 404
    listing = admin_client.get("/admin/agents/agenterasure/")
    assert listing.status_code == 200 and OTHER.encode() in listing.content
    shown = admin_client.get(f"/admin/agents/agenterasure/{record.pk}/change/")
    assert shown.status_code == 200 and b'name="_save"' not in shown.content
