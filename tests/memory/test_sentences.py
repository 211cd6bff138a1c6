"""Sentence vectors: stored with the item, indexed as a multivector, scored in hybrid search."""

import numpy as np
import pytest

from memory.embeddings import get_embedder, sentences
from memory.models import MemoryItem
from memory.services import memory_store_many, memory_update
from memory.vector_index import SearchFilter, fuse_z_scores, get_vector_index

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_engine")]

LONG = (
    "The committee met on Tuesday to review the budget for the coming year. Most of the "
    "discussion was about road repairs and the library's opening hours. Near the end, someone "
    "mentioned that the old lighthouse will be painted bright red in spring. The meeting closed "
    "at nine."
)
SHORT = [
    "The library opens at ten on Saturdays.",
    "Road repairs start next month on the main street.",
    "A storm is expected on the coast this weekend.",
    "The bakery sells sourdough bread on Fridays.",
]


def blob_rows(blob: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(blob), dtype=np.float32).reshape(-1, get_embedder().dim)


def test_an_item_of_several_sentences_keeps_each_ones_vector():
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in [LONG, *SHORT]])
    rows = dict(MemoryItem.objects.values_list("content", "sentence_embeddings"))
    parts = sentences(LONG)
    assert len(parts) == 4
    assert np.allclose(blob_rows(rows[LONG]), get_embedder().embed_documents(parts), atol=1e-5)
    assert all(bytes(rows[c]) == b"" for c in SHORT)  # one sentence: the whole text's vector


def test_new_content_gets_new_sentence_vectors():
    [stored] = memory_store_many(items=[{"agent_id": "a", "content": SHORT[0]}])
    item = MemoryItem.objects.get(pk=stored.item.pk)
    memory_update(item=item, version=item.version, changes={"content": LONG})
    item.refresh_from_db()
    assert blob_rows(item.sentence_embeddings).shape == (4, get_embedder().dim)


def test_hybrid_search_scores_an_item_by_its_best_sentence_too(settings):
    """The pooled items' dense scores blend the whole text's cosine with the best sentence's
    (MaxSim over the stored sentence vectors) before the fusion, on either engine."""
    settings.MEMORY_NEAR_DUPLICATE = 1.01
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in [LONG, *SHORT]])
    embedder = get_embedder()
    query = "what colour will the lighthouse be painted"
    call = {
        "dense": embedder.embed_query(query).tolist(),
        "sparse": embedder.sparse_query(query),
        "flt": SearchFilter(agent_id="a", now=0.0),
    }
    index = get_vector_index()
    q = np.array(call["dense"])
    rows = {row.pk: row for row in MemoryItem.objects.all()}
    whole = {pk: float(blob_rows(row.embedding)[0] @ q) for pk, row in rows.items()}
    best = {
        pk: float((blob_rows(row.sentence_embeddings) @ q).max())
        for pk, row in rows.items()
        if bytes(row.sentence_embeddings)
    }
    long_pk = next(pk for pk, row in rows.items() if row.content == LONG)
    assert best[long_pk] > whole[long_pk] + 0.1  # one sentence is about the query, the rest not
    bm25 = dict(index.search(mode="sparse", limit=100, **call))
    weight = settings.MEMORY_SENTENCE_WEIGHT = 0.3
    blended = {pk: (1 - weight) * s + weight * best.get(pk, s) for pk, s in whole.items()}
    pool = [pk for pk, _ in index.search(mode="hybrid", limit=10, whole_pool=True, **call)]
    assert set(pool) == set(rows)

    hits = index.search(mode="hybrid", limit=10, **call)

    expected = fuse_z_scores(pool, [blended, bm25])
    assert dict(hits) == pytest.approx(dict(expected), abs=1e-4)
    settings.MEMORY_SENTENCE_WEIGHT = 0.0
    plain = index.search(mode="hybrid", limit=10, **call)
    assert dict(plain) == pytest.approx(dict(fuse_z_scores(pool, [whole, bm25])), abs=1e-4)
    assert dict(hits)[long_pk] > dict(plain)[long_pk]


def test_a_rebuild_embeds_nothing(monkeypatch):
    """The sentence vectors come from the DB: the index stays derived from it."""
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in [LONG, *SHORT]])
    embedder = get_embedder()

    def refuse(*args, **kwargs):
        raise AssertionError("a rebuild embedded a text")

    monkeypatch.setattr(embedder, "embed_documents", refuse)
    index = get_vector_index()
    index.rebuild()
    query = embedder.embed_query("lighthouse painted red")
    hits = index.search(
        mode="sentences",
        dense=query.tolist(),
        sparse=embedder.sparse_query(""),
        flt=SearchFilter(agent_id="a", now=0.0),
        limit=10,
    )
    assert [MemoryItem.objects.get(pk=pk).content for pk, _ in hits] == [LONG]


def test_a_reindex_gives_items_stored_without_them_their_sentence_vectors():
    from django.core.management import call_command

    memory_store_many(items=[{"agent_id": "a", "content": c} for c in [LONG, *SHORT]])
    kept = dict(MemoryItem.objects.values_list("content", "sentence_embeddings"))
    MemoryItem.objects.update(sentence_embeddings=b"")  # as stored before they were kept
    call_command("memory_reindex")
    again = dict(MemoryItem.objects.values_list("content", "sentence_embeddings"))
    assert np.allclose(blob_rows(again[LONG]), blob_rows(kept[LONG]), atol=1e-5)
    assert all(bytes(again[c]) == b"" for c in SHORT)
