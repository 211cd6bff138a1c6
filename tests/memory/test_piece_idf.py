"""The query's tokens weighed by their word pieces' IDF over the items: the counts, the
weights, and the engines' MaxSim of weighted tokens."""

import numpy as np
import pytest

from memory.embeddings import get_embedder, token_vectors
from memory.models import MemoryItem, WordPieceCounts
from memory.selectors import memory_search, weighted_query_tokens
from memory.services import memory_count_word_pieces, memory_delete_many, memory_store_many
from memory.vector_index import TOKENS, SearchFilter, get_vector_index
from tests.memory.test_tokens import TEXTS, unit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_engine")]


def piece(word: str) -> int:
    [token] = get_embedder()._dense.model.tokenizer.encode(word, add_special_tokens=False).ids
    return token


def counts() -> tuple[int, np.ndarray]:
    row = WordPieceCounts.objects.get(embedding_model=get_embedder().model_name)
    return row.items, np.frombuffer(bytes(row.counts), dtype="<i4")


def test_each_word_piece_is_counted_once_for_each_item_that_holds_it():
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    memory_store_many(
        items=[{"agent_id": "b", "content": "The kitchen, the kitchen, the kitchen."}]
    )

    assert memory_count_word_pieces() is True

    items, held = counts()
    assert items == 7 and len(held) == get_embedder().vocabulary_size
    assert held[piece("caroline")] == 3  # three items, once each
    assert held[piece("kitchen")] == 2  # said three times by one item: counted once for it
    assert held[piece("sunset")] == 1 and held[piece("ferry")] == 0
    assert memory_count_word_pieces() is False  # the items are as they were: nothing to do

    memory_delete_many(queryset=MemoryItem.objects.filter(content=TEXTS[0]))

    assert memory_count_word_pieces() is True
    items, held = counts()
    assert items == 6 and held[piece("caroline")] == 2


def test_a_querys_tokens_weigh_by_their_pieces_idf_once_counted():
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    embedded = get_embedder().embed_query_tokens("Did Caroline paint a sunset?")
    # Before any count every token weighs 1: the MaxSim as it was.
    assert np.allclose(np.linalg.norm(weighted_query_tokens(embedded), axis=1), 1.0, atol=1e-5)

    memory_count_word_pieces()

    weights = np.linalg.norm(weighted_query_tokens(embedded), axis=1)
    by_piece = dict(zip(embedded.token_ids.tolist(), weights.tolist(), strict=True))
    n = len(TEXTS)
    assert by_piece[piece("caroline")] == pytest.approx(np.log(1 + (n - 3 + 0.5) / 3.5), rel=1e-4)
    assert by_piece[piece("sunset")] == pytest.approx(np.log(1 + (n - 1 + 0.5) / 1.5), rel=1e-4)
    assert by_piece[piece("sunset")] > by_piece[piece("caroline")]  # the rarer piece, more


def test_the_engines_sum_each_query_tokens_best_cosine_times_its_weight():
    """Under cosine an engine would normalise each query token and drop its weight: the
    tokens are compared by dot product with the items' unit vectors."""
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    embedder = get_embedder()
    query = embedder.embed_query_tokens("When did Caroline go to the support group?")
    weights = np.linspace(0.5, 3.0, len(query.tokens))
    weighted = query.tokens * weights[:, None]
    rows = {str(row.pk): row for row in MemoryItem.objects.all()}
    scores = get_vector_index().engine.pool_scores(
        modes=[TOKENS],
        dense=query.vector.tolist(),
        sparse=embedder.sparse_query("support group"),
        tokens=weighted.tolist(),
        flt=SearchFilter(agent_id="a", now=0.0, point_ids=tuple(rows)),
    )[0]
    expected = {}
    for pk, row in rows.items():
        item = unit(token_vectors(bytes(row.token_embeddings), embedder.dim).astype(np.float32))
        expected[pk] = float((query.tokens @ item.T).max(axis=1) @ weights)
    assert dict(scores) == pytest.approx(expected, abs=5e-3)


def test_a_search_sends_the_weighted_tokens(monkeypatch):
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    memory_count_word_pieces()
    index = get_vector_index()
    sent = []
    search = index.search

    def recording(**kwargs):
        sent.append(kwargs["tokens"])
        return search(**kwargs)

    monkeypatch.setattr(index, "search", recording)
    query = "Did Caroline paint a sunset?"

    hits = memory_search(agent_id="a", query=query, mode="hybrid", limit=3)

    assert hits and hits[0].item.content == TEXTS[3]
    expected = weighted_query_tokens(get_embedder().embed_query_tokens(query))
    assert np.allclose(np.array(sent[0]), expected, atol=1e-5)
    assert not np.allclose(np.linalg.norm(expected, axis=1), 1.0)  # weighted, not unit


def test_the_beat_counts_the_word_pieces_every_ten_minutes():
    from django_celery_beat.models import PeriodicTask

    from ferrum_memory.celery import app
    from memory.tasks import count_word_pieces

    schedule = PeriodicTask.objects.get(name="memory: count word pieces")  # made by migrate
    assert schedule.task == count_word_pieces.name and schedule.task in app.tasks
    assert schedule.interval.every == 600
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    assert count_word_pieces.apply().get() is True
    assert counts()[0] == len(TEXTS)
