import pytest

from ferrum_memory.core.services import api_key_create
from memory.models import MemoryItem, MemoryTombstone

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_engine")]

FACTS = [
    "Caroline went to the LGBTQ support group on 7 May and found it powerful.",
    "Melanie painted a sunrise over the lake last year.",
    "The deploy failed because the database migration timed out.",
    "Use pytest -k to run a single test by name.",
]


def store(client, content, **fields):
    response = client.post(
        "/memory/store", {"agent_id": "a", "content": content, **fields}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()


def search(client, query, **fields):
    response = client.post(
        "/memory/search", {"agent_id": "a", "query": query, **fields}, format="json"
    )
    assert response.status_code == 200, response.json()
    return [hit["item"]["content"] for hit in response.json()["results"]]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "sparse"])
def test_a_stored_item_is_found_at_once_in_every_mode(api_client, mode):
    for fact in FACTS:
        body = store(api_client, fact)
        assert body["indexed"] is True and body["duplicate"] == ""
    assert search(api_client, "why did the deploy fail?", mode=mode)[0] == FACTS[2]


def test_exact_and_near_duplicates_are_merged(api_client):
    first = store(api_client, FACTS[0], importance=0.2, tags=["x"])
    exact = store(
        api_client,
        "  caroline went to the LGBTQ support group on 7 May and found it POWERFUL. ",
        importance=0.9,
        tags=["y"],
    )
    assert exact["duplicate"] == "exact" and exact["point_id"] == first["point_id"]
    near = store(api_client, FACTS[0].replace("powerful.", "powerful!"))
    assert near["duplicate"] == "near" and near["point_id"] == first["point_id"]
    item = MemoryItem.objects.get()
    assert item.importance == 0.9 and item.tags == ["x", "y"] and item.access_count == 2
    other_agent = api_client.post(
        "/memory/store", {"agent_id": "b", "content": FACTS[0]}, format="json"
    )
    assert other_agent.json()["duplicate"] == "" and MemoryItem.objects.count() == 2


def test_a_batch_is_stored_in_one_call_and_dedups_within_itself(api_client):
    batch = [{"agent_id": "a", "content": fact} for fact in FACTS] + [
        {"agent_id": "a", "content": FACTS[1]}
    ]
    response = api_client.post("/memory/store", batch, format="json")
    assert response.status_code == 201
    items = response.json()["items"]
    assert [i["duplicate"] for i in items] == ["", "", "", "", "exact"]
    assert items[4]["point_id"] == items[1]["point_id"]
    assert MemoryItem.objects.count() == 4


def test_delete_removes_it_from_search(api_client):
    body = store(api_client, FACTS[2])
    store(api_client, FACTS[3])
    assert api_client.get(f"/memory/{body['point_id']}").status_code == 200
    assert api_client.delete(f"/memory/{body['point_id']}").status_code == 204
    assert MemoryTombstone.objects.count() == 1
    assert FACTS[2] not in search(api_client, "deploy failed database migration")
    assert api_client.delete(f"/memory/{body['point_id']}").status_code == 404


def test_filters(api_client):
    store(api_client, FACTS[0], kind="semantic", tags=["people"], importance=0.9, session_id="s1")
    store(api_client, FACTS[1], kind="episodic", tags=["art"], importance=0.1, session_id="s2")
    query = "what did Caroline and Melanie do"
    assert search(api_client, query, kinds=["episodic"]) == [FACTS[1]]
    assert search(api_client, query, tags=["people"]) == [FACTS[0]]
    assert search(api_client, query, min_importance=0.5) == [FACTS[0]]
    assert search(api_client, query, session_id="s2") == [FACTS[1]]
    assert (
        search(
            api_client,
            query,
            created_after="2000-01-01T00:00:00Z",
            created_before="2001-01-01T00:00:00Z",
        )
        == []
    )
    assert len(search(api_client, query, created_after="2000-01-01T00:00:00Z")) == 2
    # An empty range (before earlier than after) is valid input, as the schema says: no hits.
    for mode in ("hybrid", "dense", "sparse"):
        empty = {"created_after": "2030-01-02T00:00:00Z", "created_before": "2000-01-01T00:00:00Z"}
        assert search(api_client, query, mode=mode, **empty) == []


def test_expired_items_are_never_returned_and_purged(api_client):
    from datetime import timedelta

    from django.utils import timezone

    from memory.tasks import purge_expired_memories

    store(api_client, FACTS[0])
    gone = store(api_client, FACTS[1])
    MemoryItem.objects.filter(pk=gone["point_id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert search(api_client, "Melanie painted a sunrise") == [FACTS[0]]
    assert purge_expired_memories() == 1
    assert MemoryItem.objects.count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"agent_id": "a", "content": ""},
        {"agent_id": "a", "content": "x" * 20_001},
        {"agent_id": "a", "content": "ok", "importance": 1.5},
        {"agent_id": "a", "content": "ok", "importance": "0.5"},
        {"agent_id": "a", "content": "ok", "kind": "dream"},
        {"content": "ok"},
    ],
)
def test_bad_store_input_gets_400_and_writes_nothing(api_client, body):
    assert api_client.post("/memory/store", body, format="json").status_code == 400
    assert MemoryItem.objects.count() == 0


@pytest.mark.parametrize(
    "body",
    [
        {"agent_id": "a", "query": "x", "limit": 101},
        {"agent_id": "a", "query": "x", "mode": "fuzzy"},
        {"agent_id": "a", "query": ""},
        {"agent_id": "a", "query": "x", "session_diversity": -0.1},
        {"agent_id": "a", "query": "x", "session_diversity": "1"},
        {"agent_id": "a", "query": "x", "session_diversity": 0.5, "mode": "dense"},
    ],
)
def test_bad_search_input_gets_400(api_client, body):
    assert api_client.post("/memory/search", body, format="json").status_code == 400


def test_rerank_without_a_cross_encoder_is_a_clear_400(api_client):
    store(api_client, FACTS[0])
    response = api_client.post(
        "/memory/search?rerank=true", {"agent_id": "a", "query": "x"}, format="json"
    )
    assert response.status_code == 400
    assert "FASTEMBED_RERANK_MODEL" in response.json()["detail"]


def test_agent_limited_key_stays_in_its_agent(api_client):
    other = api_client.post(
        "/memory/store", {"agent_id": "b", "content": FACTS[0]}, format="json"
    ).json()
    _, raw = api_key_create(name="limited", allowed_agent_ids=["a"])
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert (
        api_client.post(
            "/memory/store", {"agent_id": "b", "content": "x"}, format="json"
        ).status_code
        == 403
    )
    assert (
        api_client.post(
            "/memory/search", {"agent_id": "b", "query": "x"}, format="json"
        ).status_code
        == 403
    )
    assert api_client.get(f"/memory/{other['point_id']}").status_code == 404
    assert api_client.delete(f"/memory/{other['point_id']}").status_code == 404


def test_health_reports_the_vector_index(anon_client, api_client):
    store(api_client, FACTS[0])
    body = anon_client.get("/health").json()
    assert body["backends"]["vector_index"]["status"] == "ok"
    assert body["backends"]["vector_index"]["lag"] == 0


def test_max_sensitivity_admits_a_level_and_every_level_below_it(api_client):
    for level in ("none", "low", "pii", "sensitive"):
        store(api_client, f"The {level} note about the deploy failure.", sensitivity=level)
    found = search(api_client, "deploy failure note", max_sensitivity="low", limit=10)
    assert sorted(found) == [
        "The low note about the deploy failure.",
        "The none note about the deploy failure.",
    ]
    assert len(search(api_client, "deploy failure note", limit=10)) == 4
    merged = store(api_client, "the NONE note about the deploy failure.", sensitivity="pii")
    assert merged["duplicate"] == "exact" and merged["item"]["sensitivity"] == "pii"
    assert "The none note about the deploy failure." not in search(
        api_client, "deploy failure note", max_sensitivity="low", limit=10
    )
