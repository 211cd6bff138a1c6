import json
from pathlib import Path

import numpy as np

from memory.embeddings import (
    BATCH_TOKENS,
    CHARS_PER_TOKEN,
    DEFAULT_DIM,
    DEFAULT_MODEL,
    DOCUMENT_BATCH,
    Embedder,
    document_batches,
    get_embedder,
)

SCIFACT = Path(__file__).resolve().parents[3] / "shared" / "data" / "scifact" / "corpus.jsonl"


def test_documents_are_embedded_by_length_and_returned_in_the_order_given():
    """embed_documents batches texts of like length together; each row must still be its own
    text's vector, as if that text were embedded alone."""
    words = "the agent stored a memory about the deploy key and the staging server".split()
    # Lengths from 1 to 60 words, shuffled, more than one batch of them.
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(words, size=n)) for n in rng.permutation(60) + 1]
    assert len(texts) > DOCUMENT_BATCH
    embedder = get_embedder()

    together = embedder.embed_documents(texts)

    alone = np.stack([embedder.embed_documents([text])[0] for text in texts])
    assert together.shape == (len(texts), embedder.dim)
    np.testing.assert_allclose(together, alone, atol=1e-3)
    # Rows are not all alike, so a mix-up of rows could not pass the check above.
    assert (together @ together.T)[~np.eye(len(texts), dtype=bool)].min() < 0.9


def test_the_dense_model_loads_on_first_use_and_the_default_width_is_its_own():
    """An index server only makes BM25 vectors: it must not pay for the dense model."""
    embedder = Embedder(DEFAULT_MODEL)
    assert embedder.sparse_document("the harbour at dawn").indices
    assert embedder.dim == DEFAULT_DIM and embedder._dense_model is None
    assert embedder.embed_query("the harbour at dawn").shape == (DEFAULT_DIM,)
    # A search needs the query model only; a store loads the documents' model.
    assert embedder._query_model is not None and embedder._dense_model is None
    embedder.embed_documents(["the harbour at dawn"])
    assert embedder._dense_model is not None


def test_queries_are_embedded_in_int8_close_to_the_vector_the_same_text_gets_as_a_document(
    settings,
):
    """The default model embeds queries with int8 matrix products: each vector is at cosine
    0.98 or more to the float32 one documents get, and not equal to it (it is the int8 model);
    with FASTEMBED_QUERY_INT8 off, queries get exactly the documents' vectors."""
    import onnx

    texts = [
        "Caroline went to the LGBTQ support group on 7 May 2023.",
        "What did Melanie paint for the art show?",
        "hi",
        "The deploy key for the staging server was rotated after the incident last week, "
        "and the new one lives in the team's vault under infrastructure secrets.",
    ]
    embedder = Embedder(DEFAULT_MODEL)
    assert embedder.int8_queries
    documents = embedder.embed_documents(texts)
    queries = np.stack([embedder.embed_query(text) for text in texts])
    cosines = (documents * queries).sum(axis=1)
    assert cosines.min() > 0.98 and cosines.max() < 0.9999

    model = onnx.load(settings.DATA_DIR / "models" / "minilm-l6-v2-int8-matmuls.onnx")
    ops = [node.op_type for node in model.graph.node]
    # Six layers of six products by a weight (query, key, value, output, two feed-forward).
    assert ops.count("MatMulInteger") == 36

    settings.FASTEMBED_QUERY_INT8 = False
    plain = Embedder(DEFAULT_MODEL)
    assert not plain.int8_queries
    np.testing.assert_allclose(
        np.stack([plain.embed_query(text) for text in texts]), documents, atol=1e-5
    )


def test_document_batches_hold_texts_of_like_length_within_the_token_budget():
    words = "the agent stored a memory about the deploy key".split()
    rng = np.random.default_rng(3)
    texts = sorted(
        (" ".join(rng.choice(words, size=n)) for n in rng.integers(1, 300, 200)), key=len
    )

    batches = document_batches(texts)

    assert [text for batch in batches for text in batch] == texts
    for batch in batches:
        padded = len(batch) * (len(batch[-1]) // CHARS_PER_TOKEN + 2)
        assert len(batch) <= DOCUMENT_BATCH
        assert len(batch) == 1 or padded <= BATCH_TOKENS
    # Short texts still share batches; long ones go alone.
    assert len(batches[0]) > DOCUMENT_BATCH // 2
    assert len(batches[-1]) == 1


def _anonymous_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return (
        int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssAnon")))
        / 1024
    )


def test_embedding_long_documents_leaves_the_process_about_the_size_it_was():
    """onnxruntime's arena keeps the largest batch's memory for the process's life: 16 SciFact
    abstracts (~256 tokens each) in one batch grew the process by ~590 MB. A batch now holds
    about one of them (~33 MB). The figure is memory, not time: it does not vary with load."""
    corpus = (json.loads(line)["text"] for line in SCIFACT.read_text().splitlines()[:300])
    abstracts = [text for text in corpus if len(text) > 1500][: 2 * DOCUMENT_BATCH]  # > 256 tokens
    assert len(abstracts) == 2 * DOCUMENT_BATCH
    embedder = get_embedder()
    embedder.embed_documents(abstracts[DOCUMENT_BATCH:])  # the model and a batch's arena
    before = _anonymous_mb()

    embedder.embed_documents(abstracts[:DOCUMENT_BATCH])

    assert _anonymous_mb() - before < 150


def test_queries_fall_back_to_the_documents_model_while_the_int8_one_cannot_be_made(
    settings, monkeypatch
):
    """A full data folder must not stop searches (tests/faults/test_disk_full.py fills a real
    one); here the derivation fails on demand, to see the fallback and the retry after it."""
    import errno

    from memory import embeddings

    settings.DATA_DIR = settings.DATA_DIR / "fresh"  # no int8 model made yet
    clock = [1000.0]
    monkeypatch.setattr(embeddings.time, "monotonic", lambda: clock[0])

    def disk_full(source, target):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(embeddings, "_with_int8_matmuls", disk_full)
    embedder = Embedder(DEFAULT_MODEL)
    text = "Where did Caroline move from four years ago?"
    document = embedder.embed_documents([text])[0]
    np.testing.assert_allclose(embedder.embed_query(text), document, atol=1e-5)
    monkeypatch.undo()
    monkeypatch.setattr(embeddings.time, "monotonic", lambda: clock[0])
    np.testing.assert_allclose(embedder.embed_query(text), document, atol=1e-5)  # not yet
    clock[0] += embeddings.QUERY_MODEL_RETRY_SECONDS
    assert 0.98 < float(embedder.embed_query(text) @ document) < 0.9999


def test_warm_up_loads_the_query_model_and_a_model_that_does_not_load_stops_nothing(
    monkeypatch, caplog
):
    """A web worker warms the query model up as it boots: it must boot when the model does
    not load too (gunicorn stops the whole server when a worker fails to boot)."""
    from memory import embeddings

    monkeypatch.setattr(embeddings, "_embedder", None)  # this process's, as a new worker's
    embeddings.warm_up()
    assert embeddings.get_embedder()._query_model is not None

    def broken(self, path):
        raise RuntimeError("no such model")

    monkeypatch.setattr(embeddings, "_embedder", None)
    monkeypatch.setattr(Embedder, "_load", broken)
    embeddings.warm_up()
    assert "the query model did not load as the process started" in caplog.text


def test_a_multitask_model_is_given_its_passage_and_query_tasks(settings):
    """fastembed's jina-embeddings-v3 embeds for a task, which its onnx_embed needs: items get
    the passage task, queries the query task. That model (570M parameters) cannot be downloaded
    here, so MiniLM stands in under its class's own task check (JinaEmbeddingV3's
    _preprocess_onnx_input, which refuses a pass without a task), the task recorded, then left
    out of MiniLM's inputs, which have none."""
    from fastembed.text.multitask_embedding import JinaEmbeddingV3

    settings.FASTEMBED_QUERY_INT8 = False  # one model for both, so one class to swap
    embedder = Embedder(DEFAULT_MODEL)
    embedder.embed_query("warm up")
    model = embedder._dense.model
    tasks = []

    class MultitaskMiniLM(type(model)):  # type: ignore[misc]
        PASSAGE_TASK, QUERY_TASK = JinaEmbeddingV3.PASSAGE_TASK, JinaEmbeddingV3.QUERY_TASK

        def _preprocess_onnx_input(self, onnx_input, **kwargs):
            onnx_input = JinaEmbeddingV3._preprocess_onnx_input(self, onnx_input, **kwargs)
            tasks.append(int(onnx_input.pop("task_id")))
            return onnx_input

    model.__class__ = MultitaskMiniLM
    item = embedder.embed_items(["The ferry left the harbour at dawn. It was late."])
    query = embedder.embed_query_tokens("when did the ferry leave?")

    assert (
        set(tasks[:-1]) == {JinaEmbeddingV3.PASSAGE_TASK}
        and tasks[-1] == JinaEmbeddingV3.QUERY_TASK
    )
    assert len(item.tokens[0]) > 0 and len(query.tokens) > 0
