import json
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from memory import embeddings
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
    assert embedder._dense_model is not None


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


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_documents_are_embedded_on_a_thread_of_lower_priority_and_queries_are_not(
    settings, monkeypatch
):
    """A store's embedding must yield the CPU to a search's: it runs on a thread
    EMBEDDING_DOCUMENT_NICENESS steps nicer than the caller, with the same vectors."""
    settings.EMBEDDING_DOCUMENT_NICENESS = 5
    # A thread of its own: the process's may exist already, made at the default niceness.
    monkeypatch.setattr(embeddings, "_document_thread", embeddings._DocumentThread())
    embedder = Embedder(DEFAULT_MODEL)
    model = embedder._dense
    seen: list[tuple[str, int]] = []
    real_embed, real_query = model.embed, model.query_embed

    def embed(*args: Any, **kwargs: Any) -> Any:  # records the thread's niceness, then embeds
        seen.append(("document", _niceness()))
        return list(real_embed(*args, **kwargs))

    def query_embed(*args: Any, **kwargs: Any) -> Any:
        seen.append(("query", _niceness()))
        return list(real_query(*args, **kwargs))

    model.embed, model.query_embed = embed, query_embed
    texts = ["the harbour at dawn", "a ferry left the quay. The gulls followed it."]

    niced = embedder.embed_documents(texts)
    embedder.embed_query("the harbour")
    settings.EMBEDDING_DOCUMENT_NICENESS = 0
    in_caller = embedder.embed_documents(texts)

    own = _niceness()
    assert seen == [("document", min(own + 5, 19)), ("query", own), ("document", own)]
    np.testing.assert_array_equal(niced, in_caller)


def _embed_in_child(queue: Any) -> None:
    queue.put(get_embedder().embed_documents(["a text embedded after the fork"]).shape)


def test_documents_are_embedded_in_a_process_forked_after_the_thread_started():
    """gunicorn and Celery fork their workers: the executor of the parent, whose thread did not
    come along, must not leave a child waiting for it forever."""
    get_embedder().embed_documents(["the parent starts its document thread"])
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_embed_in_child, args=(queue,))
    child.start()
    child.join(timeout=120)  # a bound, not a timed assertion: a hung child fails, not hangs
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert queue.get(timeout=5) == (1, DEFAULT_DIM)
