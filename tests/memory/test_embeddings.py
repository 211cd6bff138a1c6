import numpy as np

from memory.embeddings import DEFAULT_DIM, DEFAULT_MODEL, DOCUMENT_BATCH, Embedder, get_embedder


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
