"""Export and import: an agent moves as JSON Lines, and comes back the same."""

import base64
import uuid
from typing import Any

import numpy as np
import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from experience.models import DreamCycle, Experience
from memory.models import MemoryEvent, MemoryItem, MemoryTombstone
from memory.services import memory_count_word_pieces
from tests.agents.test_erasure import OTHER, client_for, ok, seed
from tests.experience.dream_helpers import stock

pytestmark = pytest.mark.django_db
AGENT = "agent-moving"
QUERIES = ["what is the code word?", "release on Friday", "why did the deploy fail?"]


def export(client: Any, agent_id: str = AGENT) -> list[bytes]:
    response = client.get(f"/agents/{agent_id}/export")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    return b"".join(response.streaming_content).splitlines()


def send(client: Any, lines: list[bytes], agent_id: str = AGENT) -> Any:
    return client.post(
        f"/agents/{agent_id}/import",
        data=b"\n".join(lines) + b"\n",
        content_type="application/x-ndjson",
    )


def searches(client: Any) -> list[list[tuple[str, float]]]:
    """QUERIES' hits once the word pieces are counted (as the beat counts them; an erasure and
    an import count them again themselves, and then this count finds nothing to do)."""
    memory_count_word_pieces()
    results = []
    for query in QUERIES:
        body = ok(client.post("/memory/search", {"agent_id": AGENT, "query": query}, format="json"))
        results.append([(h["item"]["point_id"], h["score"]) for h in body["results"]])
    return results


def same_searches(got: list[list[tuple[str, float]]], want: list[list[tuple[str, float]]]) -> bool:
    """The same hits in the same order, each score equal to a float's rounding (the engines
    sum in the order they hold points, which an import may change)."""
    return [[pk for pk, _ in hits] for hits in got] == [
        [pk for pk, _ in hits] for hits in want
    ] and [score for hits in got for _, score in hits] == pytest.approx(
        [score for hits in want for _, score in hits], abs=1e-6
    )


def probabilities(client: Any) -> dict[str, float]:
    body = ok(
        client.get(
            "/experience/replay",
            {"agent_id": AGENT, "batch_size": 512, "seed": 3, "strategy": "prioritized"},
        )
    )
    return {i["experience"]["id"]: round(i["probability"], 12) for i in body["items"]}


def loaded(client: Any) -> dict[str, Any]:
    seeded = seed(client, AGENT, "moving")
    for content in ("The deploy failed because the migration timed out.", "Ship on Friday."):
        client.post("/memory/store", {"agent_id": AGENT, "content": content}, format="json")
    # Words of no query (QUERIES): BM25's statistics of the erased copies must not matter.
    talk = ["Where are the keys?", "In the blue drawer by the door.", "Thanks, found them."]
    client.post(
        "/memory/store",
        [{"agent_id": AGENT, "session_id": "chat", "content": turn} for turn in talk],
        format="json",
    )
    rows = stock(AGENT, 20)
    for i, row in enumerate(rows):
        client.put(
            "/experience/td-error",
            {"experience_id": row.experience_id, "td_error": 0.1 * (i + 1)},
            format="json",
        )
    return seeded


def test_export_erase_import_gives_the_same_searches_and_replay(engines):
    client = client_for()
    seeded = loaded(client)
    seed(client, OTHER, "kept")
    before = searches(client)
    replay_before = probabilities(client)
    places = set(MemoryItem.objects.filter(agent_id=AGENT).values_list("id", "position"))
    assert {position for _, position in places} == {None, 0, 1, 2}
    history = ok(client.get(f"/memory/{seeded['point_id']}/history"))["results"]
    session = ok(client.get(f"/session/{seeded['sessions'][0]}"))
    lines = export(client)
    header, end = orjson.loads(lines[0]), orjson.loads(lines[-1])
    assert header["format"] == "ferrum-memory-agent" and header["version"] == 1
    assert header["embedding_model"] and end["type"] == "end"
    assert end["counts"]["memory_items"] == MemoryItem.objects.filter(agent_id=AGENT).count()
    assert end["counts"]["experiences"] == 21 and end["counts"]["sessions"] == 1

    ok(client.delete(f"/agents/{AGENT}"))
    assert not MemoryItem.objects.filter(agent_id=AGENT).exists()
    imported = ok(send(client, lines), 201)

    assert imported["imported"] == end["counts"] and imported["reembedded"] == 0
    assert memory_count_word_pieces() is False  # the import counted its items itself
    assert same_searches(searches(client), before)
    assert probabilities(client) == replay_before
    assert set(MemoryItem.objects.filter(agent_id=AGENT).values_list("id", "position")) == places
    assert ok(client.get(f"/memory/{seeded['point_id']}/history"))["results"] == history
    again = ok(client.get(f"/session/{seeded['sessions'][0]}"))
    assert again["messages"] == session["messages"] and again["task"] == session["task"]
    assert DreamCycle.objects.filter(agent_id=AGENT).count() == end["counts"]["dream_cycles"]
    # Importing the same file again changes nothing: every row is there already.
    twice = ok(send(client, lines), 201)
    assert twice["skipped"] == end["counts"] and not any(twice["imported"].values())


def test_a_file_from_another_embedding_model_is_re_embedded(engines):
    client = client_for()
    loaded(client)
    before = searches(client)
    lines = export(client)
    ok(client.delete(f"/agents/{AGENT}"))
    other = []
    for raw in lines:
        record = orjson.loads(raw)
        if record["type"] == "memory":  # another model's vectors: 8 dimensions
            record["embedding_model"] = "another/model"
            record["embedding"] = base64.b64encode(b"\x00\x00\x80\x3f" * 8).decode()
        other.append(orjson.dumps(record))
    body = ok(send(client, other), 201)
    assert body["reembedded"] == body["imported"]["memory_items"] > 0
    assert same_searches(searches(client), before)


def test_sentence_and_token_vectors_move_with_the_item_and_an_older_file_gets_them(engines):
    client = client_for()
    loaded(client)
    # No word of the queries: BM25's statistics of the erased copies must not matter (loaded).
    long = "The garden needs water. The roses bloomed early. Tomatoes come next month."
    client.post("/memory/store", {"agent_id": AGENT, "content": long}, format="json")
    row = MemoryItem.objects.get(agent_id=AGENT, content=long)
    stored, tokens = bytes(row.sentence_embeddings), bytes(row.token_embeddings)
    assert len(stored) == 3 * 384 * 4 and len(tokens) > 0 and len(tokens) % 384 == 0
    before = searches(client)
    lines = export(client)
    older = []
    for raw in lines:
        record = orjson.loads(raw)
        record.pop("sentence_embeddings", None)  # as exported before items kept them
        record.pop("token_embeddings", None)
        older.append(orjson.dumps(record))
    for file in (lines, older):
        ok(client.delete(f"/agents/{AGENT}"))
        body = ok(send(client, file), 201)
        assert body["reembedded"] == 0
        item = MemoryItem.objects.get(agent_id=AGENT, content=long)
        again = np.frombuffer(bytes(item.sentence_embeddings), dtype=np.float32)
        assert np.allclose(again, np.frombuffer(stored, dtype=np.float32), atol=1e-5)
        again_tokens = np.frombuffer(bytes(item.token_embeddings), dtype=np.int8)
        kept = np.frombuffer(tokens, dtype=np.int8)
        assert again_tokens.shape == kept.shape
        assert np.abs(again_tokens.astype(int) - kept).max() <= 1  # int8 of the same states
        assert same_searches(searches(client), before)


@pytest.mark.parametrize(
    ("damage", "line", "words"),
    [
        (lambda lines: lines[:-1], -1, "ends before its end line"),
        (lambda lines: [*lines[:3], lines[3][:40], *lines[4:]], 4, "not JSON"),
        (lambda lines: [lines[0].replace(b'"version":1', b'"version":9'), *lines[1:]], 1, ""),
        (lambda lines: [lines[1], *lines], 1, "header"),
        (lambda lines: [*lines, lines[1]], -1, "after the end line"),
        (lambda lines: [*lines[:2], *lines[3:]], -1, "the end line counts"),
        (lambda lines: [*lines[:2], b'{"type": "memory", "id": "x"}', *lines[2:]], 3, "invalid"),
        (lambda lines: [*lines[:2], b'{"type": "nope"}', *lines[2:]], 3, "unknown"),
        (lambda lines: [*lines[:2], b"[1]", *lines[2:]], 3, "object"),
        (lambda lines: [], 1, "empty"),
    ],
)
def test_a_damaged_file_imports_nothing_and_names_the_line(engines, damage, line, words):
    client = client_for()
    loaded(client)
    lines = export(client)
    ok(client.delete(f"/agents/{AGENT}"))
    damaged = damage(lines)
    expected = line if line > 0 else len(damaged) + (1 if "ends before" in words else 0)
    response = (
        send(client, damaged)
        if damaged
        else client.post(f"/agents/{AGENT}/import", data=b"", content_type="application/x-ndjson")
    )
    body = response.json()
    assert response.status_code == 400, body
    assert body["line"] == expected and words in body["detail"]
    assert "Nothing was imported" in body["detail"]
    assert not MemoryItem.objects.filter(agent_id=AGENT).exists()
    assert not Experience.objects.filter(agent_id=AGENT).exists()
    assert not MemoryEvent.objects.filter(agent_id=AGENT).exists()


def test_ids_of_another_agent_are_refused(engines):
    client = client_for()
    loaded(client)
    lines = export(client)
    response = send(client, lines, agent_id="agent-thief")
    assert response.status_code == 409 and response.json()["line"] == 2
    assert "another agent" in response.json()["detail"]
    assert not MemoryItem.objects.filter(agent_id="agent-thief").exists()
    assert not Experience.objects.filter(agent_id="agent-thief").exists()


def test_only_json_lines_are_imported_and_keys_are_checked(engines):
    client = client_for()
    assert client.post(f"/agents/{AGENT}/import", {}, format="json").status_code == 415
    limited = client_for(allowed_agent_ids=["agent-own"])
    assert limited.get(f"/agents/{AGENT}/export").status_code == 403
    assert send(limited, [b"{}"]).status_code == 403
    assert send(client_for(read_only=True), [b"{}"]).status_code == 403


def test_the_commands_move_an_agent_through_a_file(engines, tmp_path, capsys):
    client = client_for()
    loaded(client)
    before = searches(client)
    path = tmp_path / f"{uuid.uuid4().hex}.jsonl"
    call_command("export_agent", AGENT, "--output", str(path))
    call_command("export_agent", AGENT)
    printed = capsys.readouterr().out.encode().splitlines()
    assert printed[1:] == path.read_bytes().splitlines()[1:]  # all but the header's time
    ok(client.delete(f"/agents/{AGENT}"))
    call_command("import_agent", AGENT, str(path))
    assert "Imported" in capsys.readouterr().out
    assert same_searches(searches(client), before)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CommandError, match="Line"):
        call_command("import_agent", "agent-else", str(path))


def test_an_imported_item_deleted_again_leaves_every_index(engines):
    """Its id had a tombstone from the erasure: the new delete must move it to a new revision,
    or an index past the old one would keep the item."""
    client = client_for()
    seeded = loaded(client)
    lines = export(client)
    ok(client.delete(f"/agents/{AGENT}"))
    erased_at = MemoryTombstone.objects.get(point_id=seeded["point_id"]).revision
    ok(send(client, lines), 201)
    assert any(seeded["point_id"] == hit for hit, _ in searches(client)[0])
    assert client.delete(f"/memory/{seeded['point_id']}").status_code == 204
    assert MemoryTombstone.objects.get(point_id=seeded["point_id"]).revision > erased_at
    assert all(seeded["point_id"] != hit for result in searches(client) for hit, _ in result)
