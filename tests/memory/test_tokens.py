"""Token vectors: stored with the item, indexed as a multivector, scored by MaxSim over the
query's content tokens in hybrid search (late interaction)."""

import numpy as np
import pytest

from memory.embeddings import get_embedder, token_blob, token_vectors
from memory.models import MemoryItem
from memory.services import memory_store_many, memory_update
from memory.vector_index import TOKENS, SearchFilter, fuse_z_scores, get_vector_index

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_engine")]

TEXTS = [
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Melanie: We took the kids camping in the mountains last weekend.",
    "Caroline: I'm looking into counseling programs, I want to help people like me.",
    "Melanie: My painting of a sunset by the lake is finally finished!",
    "Caroline: The adoption agency called back about the interview.",
    "Melanie: The pottery class was fun, I made a bowl for the kitchen.",
]
QUERY = "When did Caroline go to the support group?"


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_an_item_keeps_a_vector_for_each_of_its_word_pieces():
    embedder = get_embedder()
    memory_store_many(items=[{"agent_id": "a", "content": TEXTS[0]}])
    item = MemoryItem.objects.get()
    pieces = embedder._dense.model.tokenizer.encode(TEXTS[0]).tokens
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    tokens = token_vectors(bytes(item.token_embeddings), embedder.dim)
    assert tokens.shape == (len(pieces) - 2, embedder.dim)
    # Their mean is the item's own vector: they are the states its vector pools.
    stored = np.frombuffer(bytes(item.embedding), dtype=np.float32)
    assert float(unit(unit(tokens).mean(axis=0, keepdims=True))[0] @ stored) > 0.99


def test_the_pass_that_keeps_the_tokens_gives_fastembeds_own_vectors():
    """The service runs the model and pools its token states itself (to keep them): the items'
    vectors must stay fastembed's, whatever the texts' lengths. Batched otherwise (by length),
    a vector may differ in its last bit; pooled without [CLS] and [SEP], as the stored tokens
    are cut, it would differ by more than 0.05."""
    embedder = get_embedder()
    texts = [*TEXTS, "Short.", " ".join(TEXTS * 4)]
    theirs = np.stack(list(embedder._dense.embed(texts)))
    assert np.abs(embedder.embed_items(texts).vectors - theirs).max() < 1e-6
    assert np.abs(embedder.embed_documents(texts) - theirs).max() < 1e-6


def test_int8_keeps_each_token_vector_within_a_thousandth_of_cosine():
    states = np.random.default_rng(7).normal(size=(50, 384)).astype(np.float32)
    again = token_vectors(token_blob(states), 384)
    cosines = np.sum(unit(states) * unit(again), axis=1)
    assert cosines.min() > 0.999
    assert len(token_blob(states)) == 50 * 384  # a byte a component


def test_a_query_keeps_only_its_content_tokens():
    """Question words, stopwords and punctuation go; the rest of a split word stays."""
    embedder = get_embedder()
    query = embedder.embed_query_tokens("What did Caroline do at the pottery workshop?")
    tokenizer = embedder._dense.model.tokenizer
    pieces = tokenizer.encode("What did Caroline do at the pottery workshop?").tokens[1:-1]
    assert {"what", "did", "do", "at", "the", "?"} <= set(pieces)
    content = [p for p in pieces if p not in {"what", "did", "do", "at", "the", "?"}]
    assert query.tokens.shape == (len(content), embedder.dim)
    assert np.allclose(np.linalg.norm(query.tokens, axis=1), 1.0, atol=1e-5)
    # The same pass gives the query's vector.
    assert np.allclose(
        query.vector, embedder.embed_query("What did Caroline do at the pottery workshop?")
    )
    # A query of stopwords alone keeps them all rather than nothing.
    assert embedder.embed_query_tokens("what is it?").tokens.shape[0] == 4


def test_new_content_gets_new_token_vectors():
    [stored] = memory_store_many(items=[{"agent_id": "a", "content": TEXTS[1]}])
    item = MemoryItem.objects.get(pk=stored.item.pk)
    before = bytes(item.token_embeddings)
    memory_update(item=item, version=item.version, changes={"content": TEXTS[0]})
    item.refresh_from_db()
    assert bytes(item.token_embeddings) != before
    assert bytes(item.token_embeddings) == get_embedder().embed_items([TEXTS[0]]).tokens[0]


def maxsim(query: np.ndarray, blob: bytes) -> float:
    return float((query @ unit(token_vectors(blob, query.shape[1])).T).max(axis=1).sum())


def test_hybrid_search_adds_the_z_score_of_each_items_maxsim(settings):
    """Each pooled item's MaxSim (each content token of the query's best cosine among the
    item's tokens, summed) is a third signal, weighted by MEMORY_TOKEN_WEIGHT, on either
    engine; an item without token vectors (stored before items kept them) gets the pool's
    mean, which adds nothing."""
    settings.MEMORY_NEAR_DUPLICATE = 1.01
    settings.MEMORY_SESSION_DIVERSITY = 0.0  # no session here; the fusion alone
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    embedder = get_embedder()
    query = embedder.embed_query_tokens(QUERY)
    call = {
        "dense": query.vector.tolist(),
        "sparse": embedder.sparse_query(QUERY),
        "flt": SearchFilter(agent_id="a", now=0.0),
    }
    index = get_vector_index()
    rows = {row.pk: row for row in MemoryItem.objects.all()}
    pool = [pk for pk, _ in index.search(mode="hybrid", limit=10, whole_pool=True, **call)]
    assert set(pool) == set(rows)
    without = dict(index.search(mode="hybrid", limit=10, **call))
    dense = dict(index.search(mode="dense", limit=100, **call))
    bm25 = dict(index.search(mode="sparse", limit=100, **call))
    assert without == pytest.approx(dict(fuse_z_scores(pool, [dense, bm25])), abs=1e-4)
    expected = {pk: maxsim(query.tokens, bytes(row.token_embeddings)) for pk, row in rows.items()}
    engine_scores = index.engine.pool_scores(
        modes=[TOKENS],
        tokens=query.tokens.tolist(),
        flt=SearchFilter(agent_id="a", now=0.0, point_ids=tuple(str(pk) for pk in pool)),
        **{k: v for k, v in call.items() if k != "flt"},
    )[0]
    assert {pk: score for pk, score in engine_scores} == pytest.approx(
        {str(pk): score for pk, score in expected.items()}, abs=2e-3
    )
    settings.MEMORY_TOKEN_WEIGHT = 1.5

    hits = dict(index.search(mode="hybrid", limit=10, tokens=query.tokens.tolist(), **call))

    fused = fuse_z_scores(pool, [dense, bm25, expected], [1.0, 1.0, 1.5])
    assert hits == pytest.approx(dict(fused), abs=1e-2)
    assert hits != pytest.approx(without, abs=1e-2)

    last = pool[-1]
    MemoryItem.objects.filter(pk=last).update(token_embeddings=b"")
    index.rebuild()
    mean = float(np.mean([score for pk, score in expected.items() if pk != last]))
    hits = dict(index.search(mode="hybrid", limit=10, tokens=query.tokens.tolist(), **call))
    fused = fuse_z_scores(pool, [dense, bm25, expected | {last: mean}], [1.0, 1.0, 1.5])
    assert hits == pytest.approx(dict(fused), abs=1e-2)

    settings.MEMORY_TOKEN_WEIGHT = 0.0
    off = dict(index.search(mode="hybrid", limit=10, tokens=query.tokens.tolist(), **call))
    assert off == pytest.approx(without, abs=1e-4)


def test_a_reindex_gives_items_stored_without_them_their_token_vectors():
    from django.core.management import call_command

    memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
    kept = dict(MemoryItem.objects.values_list("content", "token_embeddings"))
    MemoryItem.objects.update(token_embeddings=b"")  # as stored before they were kept
    call_command("memory_reindex")
    again = dict(MemoryItem.objects.values_list("content", "token_embeddings"))
    for text in TEXTS:
        old, new = token_vectors(bytes(kept[text]), 384), token_vectors(bytes(again[text]), 384)
        assert old.shape == new.shape and np.sum(unit(old) * unit(new), axis=1).min() > 0.99


def test_a_reindex_keeps_the_tokens_of_content_changed_while_it_embedded():
    from memory import services

    memory_store_many(items=[{"agent_id": "a", "content": TEXTS[0]}])
    MemoryItem.objects.update(token_embeddings=b"")  # as stored before they were kept
    embedder = get_embedder()

    def embed_while_the_item_changes(texts: list[str]) -> list[bytes]:
        blobs = embedder.embed_tokens(texts)  # the old content's
        item = MemoryItem.objects.get()
        memory_update(item=item, version=item.version, changes={"content": TEXTS[3]})
        return blobs

    services._fill_missing("token_embeddings", embed_while_the_item_changes, 8, lambda t: True)
    item = MemoryItem.objects.get()
    assert item.content == TEXTS[3]
    assert bytes(item.token_embeddings) == embedder.embed_tokens([TEXTS[3]])[0]


def _pooled_in_graph_minilm(folder):
    """A fastembed model folder whose graph pools itself (MiniLM with its [CLS] state as the
    output, as models exported with their pooling are): its pass gives no token states. No
    such model can be downloaded here, so one is made from the shipped MiniLM, in a folder
    assembled as the shipped one is (_minilm_folder)."""
    import onnx
    from onnx import helper

    from memory.embeddings import _minilm_folder, _minilm_int8_dir

    minilm = _minilm_int8_dir(folder.parent / "minilm")
    model = onnx.load((minilm / "model.onnx").resolve())
    [states] = model.graph.output
    first = helper.make_tensor("first", onnx.TensorProto.INT64, [], [0])
    model.graph.initializer.append(first)
    model.graph.node.append(helper.make_node("Gather", [states.name, "first"], ["pooled"], axis=1))
    model.graph.output.pop()
    model.graph.output.append(
        helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, ["batch", 384])
    )
    graph = folder.parent / "pooled.onnx"
    onnx.save(model, graph)
    return _minilm_folder(folder, graph)


def test_a_model_without_token_states_is_not_asked_for_them_again(settings, tmp_path, monkeypatch):
    """Its items' token blobs are empty for good: a reindex and an import must not take them
    for unfilled (each embedded every item again to get nothing)."""
    from django.core.management import call_command

    from agents.selectors import agent_export
    from agents.services import agent_erase, agent_import
    from memory.embeddings import Embedder, reset_embedder

    # A model of fastembed's class for pooled outputs whose ONNX file is model.onnx (its
    # declared width is not read: the embedder probes a configured model's).
    settings.FASTEMBED_MODEL = "BAAI/bge-large-en-v1.5"
    settings.FASTEMBED_MODEL_PATH = str(_pooled_in_graph_minilm(tmp_path / "pooled"))
    reset_embedder()
    embedded: list[str] = []
    forward = Embedder._forward

    def counted(self, model, texts, *args, **kwargs):  # the real pass, its texts recorded
        embedded.extend(texts)
        return forward(self, model, texts, *args, **kwargs)

    try:
        embedder = get_embedder()
        assert embedder.gives_token_states is False
        memory_store_many(items=[{"agent_id": "a", "content": c} for c in TEXTS])
        assert set(MemoryItem.objects.values_list("token_embeddings", flat=True)) == {b""}
        export = list(agent_export(agent_id="a"))
        monkeypatch.setattr(Embedder, "_forward", counted)

        call_command("memory_reindex")
        agent_erase(agent_id="a")
        result = agent_import(agent_id="a", lines=export)

        assert embedded == []
        assert result.imported["memory_items"] == len(TEXTS)
        assert sorted(MemoryItem.objects.values_list("content", flat=True)) == sorted(TEXTS)
    finally:
        reset_embedder()


def test_a_model_with_token_states_says_so():
    assert get_embedder().gives_token_states is True
