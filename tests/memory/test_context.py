"""POST /memory/context: recent turns and relevant memories within a token budget."""

import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from memory.context import ContextMemory, memory_line, pack_context, turn_line
from memory.embeddings import _minilm_int8_dir
from memory.models import MemoryItem
from memory.selectors import MemoryHit
from memory.tokens import count_tokens, reset_token_counter
from tests.sessions.conftest import chat

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_engine")]

AGENT = "a"
DEPLOY = [
    "The deploy failed because the database migration timed out.",
    "We fixed the deploy by running the migration before the release.",
    "The release pipeline deploys to staging first, then to production.",
]


def store(client, content, **fields):
    response = client.post(
        "/memory/store", {"agent_id": AGENT, "content": content, **fields}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()["item"]


def context(client, **body):
    response = client.post(
        "/memory/context", {"agent_id": AGENT, "token_budget": 500, **body}, format="json"
    )
    assert response.status_code == 200, response.json()
    return response.json()


def start_session(client, messages, agent_id=AGENT):
    response = client.post(
        "/session/start", {"agent_id": agent_id, "messages": messages}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()["session_id"]


def test_the_context_holds_recent_turns_then_relevant_memories(api_client):
    for fact in DEPLOY:
        store(api_client, fact, kind="semantic")
    sid = start_session(api_client, chat("hello", "why did the deploy fail last week?"))
    body = context(api_client, query="why did the deploy fail?", session_id=sid)

    assert body["tokens_used"] == count_tokens(body["context"]) <= body["token_budget"] == 500
    assert [t["content"] for t in body["recent_turns"]] == [
        "hello",
        "why did the deploy fail last week?",
    ]
    assert body["memories"][0]["item"]["content"] == DEPLOY[0]
    assert all(m["relevance"] >= 0.5 for m in body["memories"])
    today = timezone.now().date().isoformat()
    assert body["context"].startswith("## Recent turns\nAda: hello\n")
    assert f"## Relevant memories\n- [{today}, semantic] {DEPLOY[0]}" in body["context"]
    for memory in body["memories"]:
        assert memory["tokens"] == count_tokens(memory_line_of(memory) + "\n")
    assert body["dropped"] == {"turns": 0, "memories": 0} and body["degraded"] == []


def memory_line_of(memory):
    day = memory["item"]["created_at"][:10]
    return f"- [{day}, {memory['item']['kind']}] {memory['item']['content']}"


def test_an_off_topic_query_gets_no_memories_but_search_reports_relevance(api_client):
    for fact in DEPLOY:
        store(api_client, fact)
    body = context(api_client, query="What is Caroline's favourite painting of the lake?")
    assert body["memories"] == [] and body["context"] == "" and body["tokens_used"] == 0

    hits = api_client.post(
        "/memory/search",
        {"agent_id": AGENT, "query": "What is Caroline's favourite painting of the lake?"},
        format="json",
    ).json()["results"]
    assert len(hits) == 3 and all(0 <= hit["relevance"] < 0.5 for hit in hits)
    on_topic = api_client.post(
        "/memory/search",
        {"agent_id": AGENT, "query": "why did the deploy fail?", "min_relevance": 0.5},
        format="json",
    ).json()["results"]
    assert on_topic and on_topic[0]["item"]["content"] == DEPLOY[0]
    assert all(hit["relevance"] >= 0.5 for hit in on_topic)


def test_a_small_budget_keeps_newest_turns_and_whole_memories(api_client):
    for fact in DEPLOY:
        store(api_client, fact)
    turns = [f"turn number {i} about the weather" for i in range(20)]
    sid = start_session(api_client, chat(*turns))
    body = context(
        api_client, query="deploy migration", session_id=sid, token_budget=60, recent_share=0.5
    )
    kept = [t["content"] for t in body["recent_turns"]]
    assert kept and kept == turns[-len(kept) :]
    assert body["dropped"]["turns"] == 20 - len(kept)
    assert body["tokens_used"] == count_tokens(body["context"]) <= 60
    for memory in body["memories"]:
        assert memory["item"]["content"] in body["context"]


def test_what_one_part_leaves_unused_goes_to_the_other(api_client):
    for fact in DEPLOY:
        store(api_client, fact)
    sid = start_session(api_client, chat(*[f"an old turn, number {i}" for i in range(30)]))
    # No memory is relevant: the turns get the whole budget, not their 10%.
    body = context(
        api_client, query="Caroline's painting", session_id=sid, token_budget=200, memory_share=0.9
    )
    assert body["memories"] == []
    assert body["tokens_used"] > 0.5 * 200 and body["dropped"]["turns"] > 0


def test_a_memory_repeating_a_recent_turn_is_not_included_twice(api_client):
    sid = start_session(api_client, chat(DEPLOY[0]))
    store(api_client, DEPLOY[0], session_id=sid)
    store(api_client, DEPLOY[1])
    body = context(api_client, query="why did the deploy fail?", session_id=sid)
    assert body["context"].count(DEPLOY[0]) == 1
    assert [m["item"]["content"] for m in body["memories"]] == [DEPLOY[1]]
    assert body["dropped"]["memories"] == 1


def test_sensitive_memories_stay_out_unless_asked_for(api_client):
    store(api_client, DEPLOY[0], sensitivity="sensitive")
    store(api_client, DEPLOY[1], sensitivity="pii")
    default = context(api_client, query="why did the deploy fail?")
    assert [m["item"]["content"] for m in default["memories"]] == [DEPLOY[1]]
    everything = context(api_client, query="why did the deploy fail?", max_sensitivity="sensitive")
    assert {m["item"]["content"] for m in everything["memories"]} == {DEPLOY[0], DEPLOY[1]}
    assert everything["memories"][0]["item"]["sensitivity"] in {"sensitive", "pii"}


def test_importance_weight_and_recency_reorder_the_memories(api_client):
    old = store(api_client, DEPLOY[0], importance=0.1)
    store(api_client, DEPLOY[1], importance=1.0)
    MemoryItem.objects.filter(pk=old["point_id"]).update(
        created_at=timezone.now() - timedelta(days=30)
    )
    by_relevance = context(api_client, query="why did the deploy fail?", min_relevance=0.0)
    assert by_relevance["memories"][0]["item"]["content"] == DEPLOY[0]
    weighted = context(
        api_client, query="why did the deploy fail?", min_relevance=0.0, importance_weight=0.9
    )
    assert weighted["memories"][0]["item"]["content"] == DEPLOY[1]
    recent = context(
        api_client, query="why did the deploy fail?", min_relevance=0.0, recency_half_life=86400
    )
    assert recent["memories"][0]["item"]["content"] == DEPLOY[1]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"token_budget": 0}, "token_budget"),
        ({"token_budget": 200_001}, "token_budget"),
        ({"token_budget": "12"}, "token_budget"),
        ({"recent_share": 0.7, "memory_share": 0.7}, "memory_share"),
        ({"recent_share": 0.5, "memory_share": 0.5}, "memory_share"),
        ({"recent_share": 1.5}, "recent_share"),
        ({"session_id": "not-a-uuid"}, "session_id"),
        ({"max_sensitivity": "secret"}, "max_sensitivity"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api_client, body, field):
    response = api_client.post(
        "/memory/context",
        {"agent_id": AGENT, "query": "q", "token_budget": 100, **body},
        format="json",
    )
    assert response.status_code == 400 and field in response.json()


def test_unknown_closed_and_foreign_sessions(api_client):
    unknown = api_client.post(
        "/memory/context",
        {"agent_id": AGENT, "query": "q", "token_budget": 100, "session_id": str(uuid.uuid4())},
        format="json",
    )
    assert unknown.status_code == 404 and "No session" in unknown.json()["detail"]
    foreign = start_session(api_client, chat("hi"), agent_id="b")
    response = api_client.post(
        "/memory/context",
        {"agent_id": AGENT, "query": "q", "token_budget": 100, "session_id": foreign},
        format="json",
    )
    assert response.status_code == 409 and "another agent" in response.json()["detail"]
    sid = start_session(api_client, chat("hi"))
    assert api_client.post("/session/close", {"session_id": sid}, format="json").status_code == 202
    closed = api_client.post(
        "/memory/context",
        {"agent_id": AGENT, "query": "q", "token_budget": 100, "session_id": sid},
        format="json",
    )
    assert closed.status_code == 410


def test_context_tokenizer_selects_another_tokenizer(settings, tmp_path):
    text = "Tokenizers disagree about antidisestablishmentarianism and emoji 🙂."
    try:
        settings.CONTEXT_TOKENIZER = "o200k_base"
        reset_token_counter()
        o200k = count_tokens(text)
        settings.CONTEXT_TOKENIZER = "cl100k_base"
        reset_token_counter()
        cl100k = count_tokens(text)
        # The embedding model's own WordPiece tokenizer, a tokenizer.json that ships with it.
        settings.CONTEXT_TOKENIZER = str(get_embedder_tokenizer_file(tmp_path))
        reset_token_counter()
        wordpiece = count_tokens(text)
        settings.CONTEXT_TOKENIZER = "no-such-encoding"
        reset_token_counter()
        with pytest.raises(ImproperlyConfigured, match="unknown encoding"):
            count_tokens(text)
    finally:
        reset_token_counter()
    assert len({o200k, cl100k, wordpiece}) > 1 and min(o200k, cl100k, wordpiece) > 5


def get_embedder_tokenizer_file(tmp_path):
    return _minilm_int8_dir(tmp_path) / "tokenizer.json"


# The budget holds whatever the texts, budget and shares: a property of the packing alone, with
# the real tokenizer and unsaved items (no search needed to make candidates).
texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=80
)


@hypothesis_settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(texts, max_size=12),
    memories=st.lists(texts, max_size=12),
    budget=st.integers(min_value=1, max_value=400),
    recent_share=st.floats(min_value=0, max_value=1),
)
def test_the_context_never_exceeds_its_budget(turns, memories, budget, recent_share):
    messages = [{"role": "user", "content": text} for text in turns]
    now = timezone.now()
    ranked = []
    for i, text in enumerate(memories):
        item = MemoryItem(agent_id=AGENT, content=text, kind="episodic", created_at=now)
        hit = MemoryHit(item, score=0.0, relevance=1 - i / 100, cosine=0.0, term_share=0.0)
        ranked.append(ContextMemory(hit, hit.relevance, count_tokens(memory_line(item) + "\n")))
    packed = pack_context(
        messages=messages, ranked=ranked, token_budget=budget, recent_share=recent_share
    )
    assert packed.tokens_used == count_tokens(packed.context) <= budget
    kept = packed.recent_turns
    assert kept == messages[len(messages) - len(kept) :]  # the newest, in order
    for turn in kept:
        assert turn_line(turn) in packed.context
    chosen = [m.hit.item.content for m in packed.memories]
    assert chosen == memories[: len(chosen)]  # by rank, whole
    for memory in packed.memories:
        assert memory_line(memory.hit.item) in packed.context
    assert packed.dropped == {
        "turns": len(turns) - len(kept),
        "memories": len(memories) - len(chosen),
    }


def test_one_share_implies_the_other(api_client):
    sid = start_session(api_client, chat(*[f"an old turn, number {i}" for i in range(30)]))
    ask = {"query": "Caroline's painting", "session_id": sid, "token_budget": 200}
    assert context(api_client, **ask, memory_share=0.5) == context(api_client, **ask)
    assert context(api_client, **ask, memory_share=0.25) == context(
        api_client, **ask, recent_share=0.75
    )
