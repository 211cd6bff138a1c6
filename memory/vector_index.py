"""The vector index: two engines behind one interface, derived from the memory_item table.

- EdgeEngine: qdrant-edge, the embedded default. A shard opens in one process only, so each
  process takes a free shard folder under the data folder (a lock file says whose it is) and
  keeps it in step with the DB itself; a restarted process reuses a folder and catches up.
  With VECTOR_INDEX_SERVERS, only the index servers hold shards (memory.index_server).
- ServerEngine: a Qdrant server through qdrant-client when QDRANT_URL is set (tests use its
  in-process mode). All processes share it, and its cursor lives in the DB.

VectorIndex catches an engine up from the "memory" revision counter (core.revisions): rows
changed since its cursor are upserted (idempotent), tombstones deleted, and a cursor behind the
purge horizon, an index made by another embedding model or a lost state means a rebuild.
The only modules importing the Qdrant clients are this one and memory.embeddings.
"""

import ctypes
import fcntl
import functools
import heapq
import json
import logging
import operator
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.db.models import OuterRef, Q, QuerySet, Subquery

from ferrum_memory.core.exceptions import Unavailable
from ferrum_memory.core.iterables import batched
from ferrum_memory.core.revisions import revision_changes
from ferrum_memory.core.storage import is_disk_full, require_room, write_atomically
from ferrum_memory.core.telemetry import index_catch_up, traced

from .embeddings import SparseVector, get_embedder, token_vectors
from .models import REVISION, MemoryItem, MemoryTombstone, VectorIndexCursor, sensitivity_rank

logger = logging.getLogger(__name__)

DENSE, SPARSE, SENTENCES, TOKENS = "dense", "bm25", "sentences", "tokens"
WITH_PREVIOUS = "bm25_with_previous"  # a named vector, and the mode that searches it
# Hybrid search pools each mode's top PREFETCH candidates, scores every pooled item by both
# modes (an item sharing no term with the query scores 0 in BM25) and ranks by the sum of the
# two modes' z-scores over the pool. Measured on LoCoMo and SciFact (bench/retrieval.py): rank
# fusion (RRF), at every k and weighting tried, stays below SciFact's target, since ranks drop
# how far apart the candidates' scores are; the textbook k=60 even scores below BM25 alone.
PREFETCH = 50
MODES = ("dense", "sparse")  # what hybrid search fuses
# Sentence vectors: an item of two or more sentences also has each sentence's vector (stored in
# the DB with it, memory.models), indexed as one multivector compared by MaxSim, so a query's
# score against it is the cosine of its best sentence. Hybrid search gives each pooled item the
# dense score (1 - MEMORY_SENTENCE_WEIGHT) x whole text + MEMORY_SENTENCE_WEIGHT x best sentence
# (an item of one sentence keeps its whole text's) before the fusion: a long text is found by the
# one sentence the query is about, which its whole vector (MiniLM reads 256 tokens) dilutes.
# Measured by bench/levers.py (weight 0.2 to 0.5, 0.3 kept): SciFact (its first 1,000 abstracts,
# 184 train queries) nDCG@10 0.852 -> 0.859; LoCoMo turn recall@10 0.751 -> 0.760, and with the
# neighbour context 0.798 -> 0.807.
# Previous-turn words: a conversation's turn often answers in words the turn before it asked
# ("What did you paint?" / "A sunset by the lake"), so each episodic item stored with a session
# and a position is also indexed as a second BM25 document, its text joined with the text of the
# item one position before it in its session (WITH_PREVIOUS; an item with no previous item has
# its own text there). Hybrid search pools that vector's top PREFETCH too, and a pooled item's
# BM25 score becomes its own + MEMORY_PREVIOUS_TURN_WEIGHT x that document's. Measured by
# bench/levers.py (round six) on LoCoMo, over today's search: turn recall@10 0.805 -> 0.824,
# strict 0.737 -> 0.755, session 0.936 -> 0.941, Hit@1 0.420 -> 0.435; adding the previous
# turn's score instead of its words (the sum of the two BM25 scores) gave nothing (0.802 -
# 0.812), and the next turn's words too gave the same as the previous one's alone. SciFact
# (no sessions) is unchanged: each abstract's second document is the abstract.
# Late interaction (ColBERT's MaxSim, over the model's own token states): each item's token vectors
# (stored in the DB with it, memory.embeddings.token_blob) are indexed as one multivector of
# TOKENS, compared by MaxSim: for each of the query's content tokens its best cosine among the
# item's tokens, times the IDF of the query token's word piece over the items (rare pieces
# count more, as BM25 weighs its terms: memory.selectors.weighted_query_tokens), summed. The
# engines score it as a dot product of the item's unit vectors (normalised by _vectors) with
# the weighted query tokens: under cosine they would normalise the query's tokens and drop the
# weights. Hybrid search scores its pool by it and adds MEMORY_TOKEN_WEIGHT times
# its z-score to the fusion (an item without token vectors, stored before items kept them, gets
# the pool's mean). It finds a turn that says the query's words in other words, which neither
# the whole text's vector (one mean) nor BM25 (the same words) does. Measured through the
# service (bench/retrieval.py, merging off), with the session diversity raised from 0.1 to 0.25:
# LoCoMo turn recall@10 0.815 -> 0.816, strict 0.746 -> 0.747, session 0.947 -> 0.960, Hit@1
# 0.436 -> 0.452; SciFact nDCG@10 0.745 -> 0.743. Weight 1 gave session recall 0.958 at
# diversity 0.25 and strict recall 0.740 at 0.3; 1.5 at 0.2 gave 0.960. Scoring only the fused
# pool's top 30 or 50 (a third of the cost) lost LoCoMo 0.002 to 0.005 of session recall
# (bench/levers.py). The index keeps the vectors as float16 and scores them so: int8 copies
# would hold 17 KB a turn in RAM (1.7 GB at 10^5 turns), and scored on them a pool's ranks
# moved with where the segments happened to be indexed (0.002 of session recall between runs).
# The IDF weights, with MEMORY_TOKEN_WEIGHT raised from 1.25 to 2 (bench/README.md, rounds ten
# and eleven), through the service: LoCoMo turn recall@10 0.816 -> 0.823, strict 0.747 ->
# 0.751, session 0.960 -> 0.961, Hit@1 0.452 -> 0.461; SciFact nDCG@10 0.743 -> 0.745. A
# fixed table in their place (the word pieces' embedding norms, or the other dataset's IDF)
# cost both sets.
# What an index holds besides the model's vectors: an index built without it is rebuilt.
# "places": each point's position in its session, for the neighbour context (below);
# "previous": the WITH_PREVIOUS vectors; "dot-tokens": the TOKENS multivectors, by dot product.
INDEX_LAYOUT = "sentences places previous dot-tokens"
APPLY_CHUNK = 256
# The most vector components one upsert request to a Qdrant server carries (_request_batches).
REQUEST_NUMBERS = 500_000
# Qdrant's defaults for the per-agent HNSW graphs. Below the threshold (in KB of vectors, about
# 6,600 of 384 floats) an agent's points are scored exactly, and a segment is indexed (graphs
# and int8 copies) once it holds that much; stated here so that tests can lower it.
HNSW_M = 16
HNSW_EF_CONSTRUCT = 100
HNSW_FULL_SCAN_KB = 10_000
# An indexed segment keeps dense vectors as int8 too (scalar quantization), which the graph walk
# scores: measured on 10^5 points of one agent, dense search 2.5 -> 1.0 ms and the graph built
# 3x faster. Dense searches ask for the hits to be rescored with the float vectors (qdrant does
# not by default), so the scores and order returned are exact.
INT8_QUANTILE = 0.99
# An index server builds graphs once its catch-ups have added this many points (the dense
# vectors of 384 float32 that fill HNSW_FULL_SCAN_KB), or deleted as many.
OPTIMIZE_AFTER_POINTS = HNSW_FULL_SCAN_KB * 1024 // (384 * 4)
OPTIMIZE_RETRY_POINTS = 500  # after an optimize that found nothing to build
SLOW_INLINE_OPTIMIZE_SECONDS = 0.5  # logged: the whole process stood still that long
# A qdrant-edge shard's flush (its segments and the cursor to disk) took 8 ms of CPU and 17 ms
# of a store's latency at 10^4 points, once per catch-up, so once per store in each process
# holding a shard. The index being derived from the DB, what is on disk may lag: a catch-up's
# upserts are flushed at most this often (and at close), and a restart applies what came after
# the cursor on disk again, which changes nothing (an upsert or a delete done twice is done
# once). Deletions are flushed at once: an erased item's data leaves the disk with its request.
EDGE_FLUSH_SECONDS = 2.0
ROW_FIELDS = (
    "id",
    "agent_id",
    "session_id",
    "kind",
    "tags",
    "importance",
    "sensitivity",
    "created_at",
    "expires_at",
    "content",
    "embedding",
    "embedding_model",
    "sentence_embeddings",
    "token_embeddings",
    "position",
)
# The payload fields a hybrid search's pool comes back with: what the neighbour context reads.
PLACE_FIELDS = ["kind", "session_id", "position"]
# The payload fields that find a point's next turn in the DB (Engine.turns).
TURN_FIELDS = ["agent_id", "session_id", "position"]


@dataclass(frozen=True)
class SearchFilter:
    agent_id: str
    now: float
    kinds: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    session_id: str = ""
    created_after: float | None = None
    created_before: float | None = None
    min_importance: float | None = None
    # The most sensitive level admitted (a MemoryItem.Sensitivity); empty admits every level.
    max_sensitivity: str = ""
    point_ids: tuple[str, ...] = ()  # only these points (as the engine names them), when given


@dataclass(frozen=True)
class IndexPoint:
    id: uuid.UUID
    dense: list[float]
    sparse: SparseVector
    payload: dict[str, Any]
    sentences: list[list[float]] = field(default_factory=list)  # none: one sentence
    # Its word pieces' vectors, rows of int8 as stored (unit length once they reach an engine:
    # _vectors); no rows: stored before items kept them, or by a model that gives no token
    # states. An array, not lists: it goes to an index server pickled, as its bytes.
    tokens: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros((0, 0), np.int8))
    # Its text joined with its previous turn's, as BM25 terms; None: its own (`sparse`).
    with_previous: SparseVector | None = None


# An engine names a hit by its point id as the engine's own string (a UUID's canonical form):
# hybrid search passes its pool of ~100 ids back to the engine twice, and a uuid.UUID made and
# turned back into a string for each cost ~0.5 ms of a search's CPU. VectorIndex.search hands
# out uuid.UUIDs.
Hit = tuple[str, float]
Place = tuple[str, int]  # a conversation's turn: its session, and its position there
Turn = tuple[str, str, int]  # a turn of any agent: its agent, session and position
Key = TypeVar("Key", bound=Hashable)  # a point id, as the engine or the DB names it


class Engine(Protocol):
    def upsert(self, points: list[IndexPoint]) -> None: ...
    def delete(self, ids: list[uuid.UUID]) -> None: ...
    def reset(self, dim: int) -> None: ...
    def optimize(self) -> bool: ...
    def search(
        self, *, mode: str, dense: list[float], sparse: SparseVector, flt: SearchFilter, limit: int
    ) -> list[Hit]: ...
    def dense_scored_pool(
        self, *, dense: list[float], sparse: SparseVector, flt: SearchFilter, depth: int
    ) -> tuple[list[Hit], dict[str, Place]]: ...
    def pool_scores(
        self,
        *,
        modes: Sequence[str],
        dense: list[float],
        sparse: SparseVector,
        tokens: list[list[float]],
        flt: SearchFilter,
    ) -> list[list[Hit]]: ...
    def turns(self, ids: list[str]) -> list[Turn]: ...
    def load_state(self) -> dict[str, Any]: ...
    def save_state(self, state: dict[str, Any], *, durable: bool = True) -> None: ...
    def save_if_due(self) -> None: ...
    def close(self) -> None: ...


# qdrant-edge ---------------------------------------------------------------------------------


class EdgeEngine:
    def __init__(self, root: Path) -> None:
        # Loading a shard replays its log into segments through memory maps: on a full disk
        # that is a SIGBUS, so a process started then waits for room (core/storage.py).
        root.mkdir(parents=True, exist_ok=True)
        require_room(root)
        self._root = root
        self._path, self._lock_file = self._claim_folder(root)
        self._shard: Any = None
        self._state: dict[str, Any] | None = None  # state.json, once read
        self._unsaved_since: float | None = None  # the state (and shard) ahead of the disk
        if (self._path / "shard").exists() and (self._path / "state.json").exists():
            try:
                # Read here, not on first use: an unreadable state would fail every catch-up.
                state = json.loads((self._path / "state.json").read_text())
                if not (isinstance(state, dict) and isinstance(state.get("cursor"), int)):
                    raise ValueError(f"state.json holds no cursor: {state!r:.100}")
                self._state = state
                # A shard always has a segment: none left means its points are lost, which
                # load would take for an empty shard.
                if not any((self._path / "shard" / "segments").glob("*/segment.json")):
                    raise FileNotFoundError(f"no segment in {self._path / 'shard'}")
                self._shard = _load_shard(self._path / "shard")
            except Exception:  # noqa: BLE001 - a corrupt shard or state is rebuilt from the DB
                logger.warning("qdrant-edge shard at %s unreadable; rebuilding", self._path)
                self._shard, self._state = None, None

    @staticmethod
    def _claim_folder(root: Path) -> tuple[Path, Any]:
        """The first shard folder no live process holds; its lock goes with this process."""
        root.mkdir(parents=True, exist_ok=True)
        for number in range(1024):
            path = root / f"shard-{number}"
            path.mkdir(exist_ok=True)
            lock_file = open(path / "lock", "w")
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_file.close()
                continue
            return path, lock_file
        raise Unavailable("No free qdrant-edge shard folder (1024 processes hold one).")

    def reset(self, dim: int) -> None:
        import shutil

        from qdrant_edge import (
            Distance,
            EdgeConfig,
            EdgeOptimizersConfig,
            EdgeShard,
            EdgeVectorParams,
            FloatIndexParams,
            HnswIndexConfig,
            KeywordIndexParams,
            MultiVectorComparator,
            MultiVectorConfig,
            ScalarQuantizationConfig,
            ScalarType,
            UpdateOperation,
            VectorStorageDatatype,
        )

        require_room(self._path)
        self._close_shard()
        shutil.rmtree(self._path / "shard", ignore_errors=True)
        (self._path / "state.json").unlink(missing_ok=True)
        self._state, self._unsaved_since = None, None
        # Every search filters on one agent, so a graph over all agents would never be used:
        # m=0 builds none, payload_m builds one per agent (is_tenant) big enough to need it,
        # and an agent below HNSW_FULL_SCAN_KB is scanned exactly through the agent_id index.
        # The other fields only filter: a graph per value of each (enable_hnsw) would multiply
        # the indexing time for nothing.
        # The dense vectors have int8 copies (INT8_QUANTILE); the sentences are only ever
        # scored for a hybrid search's pool (filtered by id): no graph for them.
        int8 = ScalarQuantizationConfig(ScalarType.Int8, quantile=INT8_QUANTILE, always_ram=True)
        pool_only = HnswIndexConfig(
            m=0, payload_m=0, ef_construct=HNSW_EF_CONSTRUCT, full_scan_threshold=0
        )
        sentences = EdgeVectorParams(
            size=dim,
            distance=Distance.Cosine,
            multivector_config=MultiVectorConfig(MultiVectorComparator.MaxSim),
            quantization_config=int8,
            hnsw_config=pool_only,
        )
        # The tokens likewise, but as float16, without int8 copies, by dot product (see TOKENS).
        tokens = EdgeVectorParams(
            size=dim,
            distance=Distance.Dot,
            multivector_config=MultiVectorConfig(MultiVectorComparator.MaxSim),
            datatype=VectorStorageDatatype.Float16,
            hnsw_config=pool_only,
        )
        config = EdgeConfig(
            vectors={
                DENSE: EdgeVectorParams(
                    size=dim, distance=Distance.Cosine, quantization_config=int8
                ),
                SENTENCES: sentences,
                TOKENS: tokens,
            },
            sparse_vectors=_sparse_vectors(),
            hnsw_config=HnswIndexConfig(
                m=0,
                payload_m=HNSW_M,
                ef_construct=HNSW_EF_CONSTRUCT,
                full_scan_threshold=HNSW_FULL_SCAN_KB,
            ),
            optimizers=EdgeOptimizersConfig(indexing_threshold=HNSW_FULL_SCAN_KB),
            max_search_threads=_search_threads(),
        )
        self._shard = EdgeShard.create(str(self._path / "shard"), config)
        keyword, number = KeywordIndexParams(enable_hnsw=False), FloatIndexParams(enable_hnsw=False)
        indexes: list[tuple[str, Any]] = [
            ("agent_id", KeywordIndexParams(is_tenant=True)),
            ("kind", keyword),
            ("tags", keyword),
            ("session_id", keyword),
            ("importance", number),
            ("sensitivity", number),
            ("created_at", number),
            ("expires_at", number),
        ]
        for name, schema in indexes:
            self._shard.update(UpdateOperation.create_field_index(name, schema))

    def _need_shard(self) -> Any:
        if self._shard is None:
            raise Unavailable("The vector index is not built yet.")
        return self._shard

    def _shard_to_write(self) -> Any:
        """The shard, if the disk has room: a write through its memory maps on a full disk
        would kill the process (SIGBUS) instead of failing (core/storage.py)."""
        require_room(self._path)
        return self._need_shard()

    def upsert(self, points: list[IndexPoint]) -> None:
        from qdrant_edge import Point, UpdateOperation
        from qdrant_edge import SparseVector as EdgeSparse

        self._shard_to_write().update(
            UpdateOperation.upsert_points(
                [Point(str(p.id), _vectors(p, EdgeSparse), p.payload) for p in points]
            )
        )

    def optimize(self) -> bool:
        """Index what the updates left in plain segments: qdrant-edge optimizes only when asked,
        and a plain segment is searched by scanning every vector. A no-op costs ~0.1 ms; a
        segment past the optimizer's threshold costs seconds, holding the GIL all along (so
        a thread of the same process would stall it just the same): see memory.index_server.
        True when it built something.

        A build leaves the shard holding its scratch memory (measured at 10^5 points of one
        agent: 661 MB resident after the build, 317 MB once the shard was closed and loaded
        again), so the shard is reopened after one, by the caller's lock (an index server's
        busy window): ~0.4 s at 6 x 10^4 points."""
        built = bool(self._shard_to_write().optimize())
        if built:
            self._reopen()
        return built

    def _reopen(self) -> None:
        """Close the shard and load it again from disk, then give the freed memory back to the
        system (glibc keeps what the shard freed otherwise). A shard that does not load is
        rebuilt from the DB by the next catch-up, as at start."""
        self._need_shard().flush()  # what the state's cursor counts stays on disk
        self._close_shard()
        try:
            self._shard = _load_shard(self._path / "shard")
        except Exception:  # rebuilt from the DB, as a damaged shard at start
            logger.exception("qdrant-edge shard at %s did not load again; rebuilding", self._path)
            self._state, self._unsaved_since = None, None
        release_freed_memory()

    def delete(self, ids: list[uuid.UUID]) -> None:
        from qdrant_edge import UpdateOperation

        self._shard_to_write().update(UpdateOperation.delete_points([str(i) for i in ids]))

    def search(
        self, *, mode: str, dense: list[float], sparse: SparseVector, flt: SearchFilter, limit: int
    ) -> list[Hit]:
        request = _edge_request(mode, dense, sparse, _edge_filter(flt), limit)
        return _id_scores(self._need_shard().query(request))

    def pool_scores(
        self,
        *,
        modes: Sequence[str],
        dense: list[float],
        sparse: SparseVector,
        tokens: list[list[float]],
        flt: SearchFilter,
    ) -> list[list[Hit]]:
        """Each mode's scores of the points `flt.point_ids` names: one batch, which shares its
        pass over the segments (2.3 -> 1.8 ms for the two at 10^4 items of one agent)."""
        from qdrant_edge import QueryBatchRequest

        edge_filter, limit = _edge_filter(flt), len(flt.point_ids)
        batch = QueryBatchRequest(
            [_edge_request(mode, dense, sparse, edge_filter, limit, tokens) for mode in modes]
        )
        return [_id_scores(hits) for hits in self._need_shard().query_batch(batch)]

    def dense_scored_pool(
        self, *, dense: list[float], sparse: SparseVector, flt: SearchFilter, depth: int
    ) -> tuple[list[Hit], dict[str, Place]]:
        """Each mode's top `depth` hits, pooled, each with its dense score, and the places of
        those that have one: one query."""
        from qdrant_edge import PayloadSelector, Prefetch, QueryRequest

        edge_filter, modes = _edge_filter(flt), _pool_modes()
        queries = {mode: _edge_query(mode, dense, sparse) for mode in modes}
        query, params = queries["dense"]
        request = QueryRequest(
            limit=len(modes) * depth,
            filter=edge_filter,
            with_payload=PayloadSelector.Include(PLACE_FIELDS),
            prefetches=[
                Prefetch(limit=depth, query=each, filter=edge_filter, params=each_params)
                for each, each_params in queries.values()
            ],
            query=query,
            params=params,
        )
        return _pool(self._need_shard().query(request))

    def turns(self, ids: list[str]) -> list[Turn]:
        from qdrant_edge import PayloadSelector

        records = self._need_shard().retrieve(ids, PayloadSelector.Include(TURN_FIELDS), False)
        return _turns(record.payload or {} for record in records)

    def load_state(self) -> dict[str, Any]:
        # Read once: this process alone writes the folder it holds (every search asks).
        if self._state is None:
            path = self._path / "state.json"
            exists = self._shard is not None and path.exists()
            self._state = dict(json.loads(path.read_text())) if exists else {}
        return dict(self._state)

    def save_state(self, state: dict[str, Any], *, durable: bool = True) -> None:
        """Hold `state` (the cursor); flush it with the shard when `durable` or when the
        unflushed changes are EDGE_FLUSH_SECONDS old."""
        self._state = dict(state)
        self._unsaved_since = self._unsaved_since or time.monotonic()
        if durable:
            self._flush()
        else:
            self.save_if_due()

    def save_if_due(self) -> None:
        unsaved = self._unsaved_since
        if unsaved is not None and time.monotonic() - unsaved >= EDGE_FLUSH_SECONDS:
            self._flush()

    def _flush(self) -> None:
        self._need_shard().flush()  # the cursor must never run ahead of what is on disk
        write_atomically(self._path / "state.json", json.dumps(self._state))
        self._unsaved_since = None

    def _close_shard(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def close(self) -> None:
        """Flush what is not on disk yet, close the shard and give its folder back for the
        next process."""
        try:
            if self._unsaved_since is not None and self._shard is not None:
                self._flush()
        finally:
            self._close_shard()
            self._lock_file.close()


def _sparse_vectors() -> dict[str, Any]:
    from qdrant_edge import EdgeSparseVectorParams, Modifier

    return {name: EdgeSparseVectorParams(modifier=Modifier.Idf) for name in (SPARSE, WITH_PREVIOUS)}


def _search_threads() -> int:
    """VECTOR_INDEX_SEARCH_THREADS, 0 meaning one per CPU. Always a number: qdrant-edge takes
    None for "as the shard was made", not for its CPU-derived default."""
    return settings.VECTOR_INDEX_SEARCH_THREADS or os.cpu_count() or 1


def _load_shard(path: Path) -> Any:
    """The shard at `path`, its search pool sized by the setting (a load stores the value in
    the shard's edge_config.json; a load's config must name a vector, so the sparse one)."""
    from qdrant_edge import EdgeConfig, EdgeShard

    config = EdgeConfig(sparse_vectors=_sparse_vectors(), max_search_threads=_search_threads())
    return EdgeShard.load(str(path), config)


def release_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _vectors(point: IndexPoint, sparse_type: Callable[[list[int], list[float]], Any]) -> Any:
    """A point's named vectors, as either engine takes them (`sparse_type` makes its sparse
    vectors from indices and values); an item of one sentence has no sentence vectors."""
    with_previous = point.with_previous or point.sparse
    vectors: dict[str, Any] = {
        DENSE: point.dense,
        SPARSE: sparse_type(point.sparse.indices, point.sparse.values),
        WITH_PREVIOUS: sparse_type(with_previous.indices, with_previous.values),
    }
    if point.sentences:
        vectors[SENTENCES] = point.sentences
    if len(point.tokens):  # unit length: scored by dot product (see TOKENS)
        tokens = point.tokens.astype(np.float32)
        vectors[TOKENS] = tokens / np.linalg.norm(tokens, axis=1, keepdims=True)
    return vectors


def _listed(point: IndexPoint) -> dict[str, Any]:
    """A point's named vectors as a Qdrant server's client sends them (JSON: lists)."""
    from qdrant_client import models

    vectors = _vectors(
        point, lambda indices, values: models.SparseVector(indices=indices, values=values)
    )
    if TOKENS in vectors:
        vectors[TOKENS] = vectors[TOKENS].tolist()
    return vectors


def _id_scores(hits: Iterable[Any]) -> list[Hit]:
    """(point id, score) of each hit, as either engine answers them."""
    return [(str(hit.id), float(hit.score)) for hit in hits]


def _pool_modes() -> tuple[str, ...]:
    """The modes whose top hits make a hybrid search's pool."""
    return (*MODES, WITH_PREVIOUS) if settings.MEMORY_PREVIOUS_TURN_WEIGHT else MODES


def _turns(payloads: Iterable[dict[str, Any]]) -> list[Turn]:
    """The (agent, session, position) of each payload that has all three."""
    turns = []
    for payload in payloads:
        agent, session, position = (payload.get(name) for name in TURN_FIELDS)
        if agent and session and position is not None:
            turns.append((agent, session, int(position)))
    return turns


def _pool(hits: Sequence[Any]) -> tuple[list[Hit], dict[str, Place]]:
    """A pool's (point id, score) and the place of each of its points that has one, as either
    engine answers them (each hit with PLACE_FIELDS of its payload)."""
    scores, places = _id_scores(hits), {}
    for (pk, _), hit in zip(scores, hits, strict=True):
        payload = hit.payload or {}
        session, position = payload.get("session_id"), payload.get("position")
        # A consolidation's items (summary, facts, decisions) are no conversation: with the
        # context, a session's facts crowded each other into the top 10 and cost the
        # consolidation bench 3 points of session recall@10 (0.866 -> 0.837).
        if payload.get("kind") == MemoryItem.Kind.EPISODIC and session and position is not None:
            places[pk] = (session, position)
    return scores, places


def _edge_query(
    mode: str, dense: list[float], sparse: SparseVector, tokens: Sequence[list[float]] = ()
) -> tuple[Any, Any]:
    """One mode's query and search params; dense hits are rescored with the float vectors, the
    tokens' MaxSim is not (it ranks a pool that is already there)."""
    from qdrant_edge import QuantizationSearchParams, Query, SearchParams
    from qdrant_edge import SparseVector as EdgeSparse

    rescored = SearchParams(quantization=QuantizationSearchParams(rescore=True))
    if mode == "dense":
        return Query.Nearest(dense, using=DENSE), rescored
    if mode == SENTENCES:  # MaxSim of one query vector: the best sentence's cosine
        return Query.Nearest([dense], using=SENTENCES), rescored
    if mode == TOKENS:
        return Query.Nearest(list(tokens), using=TOKENS), None
    using = WITH_PREVIOUS if mode == WITH_PREVIOUS else SPARSE
    return Query.Nearest(EdgeSparse(sparse.indices, sparse.values), using=using), None


def _edge_request(
    mode: str,
    dense: list[float],
    sparse: SparseVector,
    flt: Any,
    limit: int,
    tokens: Sequence[list[float]] = (),
) -> Any:
    from qdrant_edge import QueryRequest

    query, params = _edge_query(mode, dense, sparse, tokens)
    return QueryRequest(limit=limit, filter=flt, with_payload=False, query=query, params=params)


def _edge_filter(flt: SearchFilter) -> Any:
    from qdrant_edge import FieldCondition, Filter, HasIdCondition, MatchAny, MatchValue, RangeFloat

    must: list[Any] = [FieldCondition("agent_id", match=MatchValue(flt.agent_id))]
    if flt.point_ids:
        must.append(HasIdCondition(set(flt.point_ids)))
    if flt.kinds:
        must.append(FieldCondition("kind", match=MatchAny(flt.kinds)))
    if flt.tags:
        must.append(FieldCondition("tags", match=MatchAny(flt.tags)))
    if flt.session_id:
        must.append(FieldCondition("session_id", match=MatchValue(flt.session_id)))
    if flt.created_after is not None or flt.created_before is not None:
        must.append(
            FieldCondition(
                "created_at", range=RangeFloat(gte=flt.created_after, lte=flt.created_before)
            )
        )
    if flt.min_importance is not None:
        must.append(FieldCondition("importance", range=RangeFloat(gte=flt.min_importance)))
    # Items that never expire carry no expires_at, and items of no sensitivity no sensitivity
    # (as every point indexed before the field existed), so they pass these must_nots.
    must_not: list[Any] = [FieldCondition("expires_at", range=RangeFloat(lte=flt.now))]
    if flt.max_sensitivity:
        too_sensitive = RangeFloat(gt=sensitivity_rank(flt.max_sensitivity))
        must_not.append(FieldCondition("sensitivity", range=too_sensitive))
    return Filter(must=must, must_not=must_not)


# Qdrant server (qdrant-client) ---------------------------------------------------------------


class ServerEngine:
    def __init__(self, client: Any, collection: str) -> None:
        self._client = client
        self._collection = collection
        self._state_key = f"qdrant:{collection}"

    def reset(self, dim: int) -> None:
        from qdrant_client import models

        if self._client.collection_exists(self._collection):
            self._client.delete_collection(self._collection)
        int8 = models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(
                type=models.ScalarType.INT8, quantile=INT8_QUANTILE, always_ram=True
            )
        )
        pool_only = models.HnswConfigDiff(m=0)
        max_sim = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
        cosine = models.Distance.COSINE
        self._client.create_collection(
            self._collection,
            vectors_config={
                DENSE: models.VectorParams(size=dim, distance=cosine, quantization_config=int8),
                SENTENCES: models.VectorParams(
                    size=dim,
                    distance=cosine,
                    multivector_config=max_sim,
                    hnsw_config=pool_only,
                    quantization_config=int8,
                ),
                TOKENS: models.VectorParams(
                    size=dim,
                    distance=models.Distance.DOT,
                    multivector_config=max_sim,
                    hnsw_config=pool_only,
                    datatype=models.Datatype.FLOAT16,
                ),
            },
            sparse_vectors_config={
                name: models.SparseVectorParams(modifier=models.Modifier.IDF)
                for name in (SPARSE, WITH_PREVIOUS)
            },
        )
        self._client.create_payload_index(
            self._collection,
            "agent_id",
            models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
        )
        kinds = models.PayloadSchemaType
        for name, schema in (
            ("kind", kinds.KEYWORD),
            ("tags", kinds.KEYWORD),
            ("session_id", kinds.KEYWORD),
            ("importance", kinds.FLOAT),
            ("sensitivity", kinds.FLOAT),
            ("created_at", kinds.FLOAT),
            ("expires_at", kinds.FLOAT),
        ):
            self._client.create_payload_index(self._collection, name, schema)
        _save_server_state(self._state_key, {})

    def optimize(self) -> bool:
        """Nothing to do: a Qdrant server runs its optimizers in the background."""
        return False

    def upsert(self, points: list[IndexPoint]) -> None:
        from qdrant_client import models

        for batch in _request_batches(points):
            self._client.upsert(
                self._collection,
                wait=True,
                points=[
                    models.PointStruct(id=str(p.id), payload=p.payload, vector=_listed(p))
                    for p in batch
                ],
            )

    def delete(self, ids: list[uuid.UUID]) -> None:
        from qdrant_client import models

        self._client.delete(
            self._collection,
            wait=True,
            points_selector=models.PointIdsList(points=[str(i) for i in ids]),
        )

    def search(
        self, *, mode: str, dense: list[float], sparse: SparseVector, flt: SearchFilter, limit: int
    ) -> list[Hit]:
        query, using, params = _server_query(mode, dense, sparse)
        hits = self._client.query_points(
            self._collection,
            query=query,
            using=using,
            limit=limit,
            query_filter=_server_filter(flt),
            search_params=params,
        ).points
        return _id_scores(hits)

    def pool_scores(
        self,
        *,
        modes: Sequence[str],
        dense: list[float],
        sparse: SparseVector,
        tokens: list[list[float]],
        flt: SearchFilter,
    ) -> list[list[Hit]]:
        """Each mode's scores of the points `flt.point_ids` names: one request."""
        from qdrant_client import models

        server_filter, requests = _server_filter(flt), []
        for mode in modes:
            query, using, params = _server_query(mode, dense, sparse, tokens)
            requests.append(
                models.QueryRequest(
                    query=query,
                    using=using,
                    filter=server_filter,
                    params=params,
                    limit=len(flt.point_ids),
                )
            )
        answers = self._client.query_batch_points(self._collection, requests=requests)
        return [_id_scores(answer.points) for answer in answers]

    def dense_scored_pool(
        self, *, dense: list[float], sparse: SparseVector, flt: SearchFilter, depth: int
    ) -> tuple[list[Hit], dict[str, Place]]:
        """Each mode's top `depth` hits, pooled, each with its dense score, and the places of
        those that have one: one request."""
        from qdrant_client import models

        server_filter, modes = _server_filter(flt), _pool_modes()
        queries = {mode: _server_query(mode, dense, sparse) for mode in modes}
        query, using, params = queries["dense"]
        hits = self._client.query_points(
            self._collection,
            prefetch=[
                models.Prefetch(
                    query=each,
                    using=each_using,
                    params=each_params,
                    filter=server_filter,
                    limit=depth,
                )
                for each, each_using, each_params in queries.values()
            ],
            query=query,
            using=using,
            limit=len(modes) * depth,
            query_filter=server_filter,
            search_params=params,
            with_payload=PLACE_FIELDS,
        ).points
        return _pool(hits)

    def turns(self, ids: list[str]) -> list[Turn]:
        records = self._client.retrieve(
            self._collection, ids=ids, with_payload=TURN_FIELDS, with_vectors=False
        )
        return _turns(record.payload or {} for record in records)

    def load_state(self) -> dict[str, Any]:
        if not self._client.collection_exists(self._collection):
            return {}
        return _load_server_state(self._state_key)

    def save_state(self, state: dict[str, Any], *, durable: bool = True) -> None:
        _save_server_state(self._state_key, state)  # the Qdrant server keeps its points itself

    def save_if_due(self) -> None:
        pass

    def close(self) -> None:
        self._client.close()


def _server_query(
    mode: str, dense: list[float], sparse: SparseVector, tokens: Sequence[list[float]] = ()
) -> tuple[Any, str, Any]:
    """One mode's query, vector name and search params, as _edge_query's."""
    from qdrant_client import models

    rescored = models.SearchParams(quantization=models.QuantizationSearchParams(rescore=True))
    if mode == "dense":
        return dense, DENSE, rescored
    if mode == SENTENCES:
        return [dense], SENTENCES, rescored
    if mode == TOKENS:
        return list(tokens), TOKENS, None
    using = WITH_PREVIOUS if mode == WITH_PREVIOUS else SPARSE
    return models.SparseVector(indices=sparse.indices, values=sparse.values), using, None


def _server_filter(flt: SearchFilter) -> Any:
    from qdrant_client import models

    must: list[Any] = [
        models.FieldCondition(key="agent_id", match=models.MatchValue(value=flt.agent_id))
    ]
    if flt.point_ids:
        must.append(models.HasIdCondition(has_id=list(flt.point_ids)))
    if flt.kinds:
        must.append(models.FieldCondition(key="kind", match=models.MatchAny(any=flt.kinds)))
    if flt.tags:
        must.append(models.FieldCondition(key="tags", match=models.MatchAny(any=flt.tags)))
    if flt.session_id:
        must.append(
            models.FieldCondition(key="session_id", match=models.MatchValue(value=flt.session_id))
        )
    if flt.created_after is not None or flt.created_before is not None:
        must.append(
            models.FieldCondition(
                key="created_at", range=models.Range(gte=flt.created_after, lte=flt.created_before)
            )
        )
    if flt.min_importance is not None:
        must.append(
            models.FieldCondition(key="importance", range=models.Range(gte=flt.min_importance))
        )
    must_not: list[Any] = [models.FieldCondition(key="expires_at", range=models.Range(lte=flt.now))]
    if flt.max_sensitivity:
        too_sensitive = models.Range(gt=sensitivity_rank(flt.max_sensitivity))
        must_not.append(models.FieldCondition(key="sensitivity", range=too_sensitive))
    return models.Filter(must=must, must_not=must_not)


def _server_down(exc: Exception) -> bool:
    """Is `exc` qdrant-client's error for a server that does not answer, or answers with a
    server error? A 4xx is our bug, not an outage. (Imported here: the client is slow to
    import.)"""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return (exc.status_code or 500) >= 500
    return isinstance(exc, ResponseHandlingException)


def _load_server_state(key: str) -> dict[str, Any]:
    row = VectorIndexCursor.objects.filter(name=key).first()
    return {"cursor": row.cursor, "model": row.embedding_model} if row else {}


def _save_server_state(key: str, state: dict[str, Any]) -> None:
    VectorIndexCursor.objects.update_or_create(
        name=key,
        defaults={"cursor": state.get("cursor", -1), "embedding_model": state.get("model", "")},
    )


# Keeping an engine in step with the DB -------------------------------------------------------


class VectorIndex:
    """An engine kept in step with the DB.

    With `optimize_inline` (in-process: each web and worker process has its own index) a
    catch-up also builds the graphs of what it added, in the request that made it. Without (an
    index server, memory.index_server), points wait in plain segments, which are searched
    exactly, until the server's optimizer thread calls `optimize` (see `optimize_due`)."""

    def __init__(self, engine: Engine, *, optimize_inline: bool = True) -> None:
        self.engine = engine
        self.optimize_inline = optimize_inline
        self._lock = threading.Lock()
        self._unoptimized = 0  # points upserted or deleted since the last optimize
        self._rebuilt = False  # reset since the last optimize

    @property
    def engine_name(self) -> str:
        return type(self.engine).__name__

    @property
    def cursor(self) -> int:
        return int(self.engine.load_state().get("cursor", -1))

    def optimize_due(self) -> bool:
        """Has enough been added since the last optimize for the optimizer to build graphs?

        qdrant-edge indexes a segment once its vectors pass OPTIMIZE_AFTER_POINTS worth of
        HNSW_FULL_SCAN_KB; a call before that is a no-op, so it is not worth stopping for."""
        return self._rebuilt or self._unoptimized >= OPTIMIZE_AFTER_POINTS

    def optimize(self) -> None:
        with self._lock:
            built = self.engine.optimize()
            self._rebuilt = False
            # Nothing built: the plain segment is still below the optimizer's threshold (a
            # rebuild's points included), so its points still count; try again a little later.
            retry_at = max(0, OPTIMIZE_AFTER_POINTS - OPTIMIZE_RETRY_POINTS)
            self._unoptimized = 0 if built else min(self._unoptimized, retry_at)

    def rebuild(self) -> None:
        """Drop whatever the engine holds and fill it again from the DB."""
        with self._lock:
            self.engine.reset(get_embedder().dim)
            self._catch_up()

    def catch_up(self) -> None:
        """Apply what the DB committed since the cursor; rebuild when that cannot be done."""
        with self._lock:
            self._catch_up()

    @index_catch_up(REVISION)
    def _catch_up(self) -> None:
        embedder = get_embedder()
        state = self.engine.load_state()
        cursor = int(state.get("cursor", -1))
        if state.get("model") != _fingerprint(embedder.model_name):
            cursor = -1  # made by another model or layout, or never built: rebuild
        changes = revision_changes(
            name=REVISION,
            cursor=cursor,
            rows=MemoryItem.objects.all(),
            tombstones=MemoryTombstone.objects.all(),
        )
        if changes is None:
            return
        gone: list[Any] = []
        # Where deleted or changed items were (an edit, a move): the turns after them hold
        # their words in WITH_PREVIOUS, so they are indexed again below.
        were: list[Turn] = []
        if changes.rebuild:
            self.engine.reset(embedder.dim)
            self._rebuilt = True
        else:
            gone = list(changes.gone.values_list("point_id", flat=True))
            if gone:
                were = self.engine.turns([str(pk) for pk in gone])
                self.engine.delete(gone)
                self._unoptimized += len(gone)
        upserted: set[uuid.UUID] = set()
        now_at: list[Turn] = []
        for chunk in batched(
            index_rows(changes.changed).iterator(chunk_size=APPLY_CHUNK), APPLY_CHUNK
        ):
            points = [_point(row, embedder.model_name) for row in chunk]
            if not changes.rebuild:  # a rebuild indexes every turn with its previous one
                were += self.engine.turns([str(point.id) for point in points])  # before the upsert
                upserted.update(point.id for point in points)
                now_at += _turns(point.payload for point in points)
            self.engine.upsert(points)
            self._unoptimized += len(chunk)
        if not changes.rebuild:
            followers = [pk for pk in next_turns([*were, *now_at]) if pk not in upserted]
            for ids in batched(followers, APPLY_CHUNK):
                rows = index_rows(MemoryItem.objects.filter(pk__in=ids))
                self.engine.upsert([_point(row, embedder.model_name) for row in rows])
                self._unoptimized += len(ids)
        if self.optimize_inline:
            started = time.perf_counter()
            self.engine.optimize()
            self._unoptimized, self._rebuilt = 0, False
            took = time.perf_counter() - started
            if took >= SLOW_INLINE_OPTIMIZE_SECONDS:
                logger.warning(
                    "vector index built graphs for %.2f s inside a request, stopping this "
                    "process meanwhile (VECTOR_INDEX_SERVERS=2 builds them off the request path)",
                    took,
                )
        self.engine.save_state(
            {"cursor": changes.upper, "model": _fingerprint(embedder.model_name)},
            durable=changes.rebuild or bool(gone),
        )

    def save_if_due(self) -> None:
        """Flush what catch-ups left unflushed once it is due (EDGE_FLUSH_SECONDS), when no
        catch-up comes to do it: an index server's idle moments."""
        with self._lock:
            self.engine.save_if_due()

    @traced(
        "vector_index.search",
        lambda self, **call: {"agent_id": call["flt"].agent_id, "mode": call["mode"]},
        result_count=len,
    )
    def search(
        self,
        *,
        mode: str,
        dense: list[float],
        sparse: SparseVector,
        flt: SearchFilter,
        limit: int,
        tokens: Sequence[Sequence[float]] = (),
        whole_pool: bool = False,
        session_diversity: float | None = None,
    ) -> list[tuple[uuid.UUID, float]]:
        """The top `limit` hits; hybrid with `whole_pool`: every pooled candidate, ranked (the
        pool is the same either way: each mode's top max(PREFETCH, limit)). Hybrid scores the
        pool by the query's content `tokens` too (none: no late interaction); its session
        diversity is `session_diversity`, or MEMORY_SESSION_DIVERSITY when None."""
        # One thread at a time: a shard is not shared between threads mid-update.
        with self._lock:
            try:
                self._catch_up_unless_disk_full()
                if mode == "hybrid":
                    hits = self._hybrid_search(
                        dense=dense,
                        sparse=sparse,
                        tokens=[list(token) for token in tokens],
                        flt=flt,
                        limit=limit,
                        session_diversity=session_diversity,
                    )
                    if not whole_pool:
                        hits = hits[:limit]
                else:
                    hits = self.engine.search(
                        mode=mode, dense=dense, sparse=sparse, flt=flt, limit=limit
                    )
                return [(uuid.UUID(pk), score) for pk, score in hits]
            except Exception as exc:
                if not _server_down(exc):
                    raise
                raise Unavailable(
                    "The vector index (Qdrant server) does not answer: search is unavailable "
                    "until it is back. Stores are still accepted and indexed when it returns."
                ) from exc

    def _catch_up_unless_disk_full(self) -> None:
        """Reads go on while the disk is full: the index answers from what it holds and
        catches up once there is room."""
        try:
            self._catch_up()
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            logger.warning("vector index behind the DB until the disk has room: %s", exc)

    def _hybrid_search(
        self,
        *,
        dense: list[float],
        sparse: SparseVector,
        tokens: list[list[float]],
        flt: SearchFilter,
        limit: int,
        session_diversity: float | None = None,
    ) -> list[Hit]:
        """Two engine calls: the pool with its dense scores and places, then the pool's BM25,
        best sentence and token scores. The whole pool, fused and given its neighbour context,
        best first."""
        dense_hits, places = self.engine.dense_scored_pool(
            dense=dense, sparse=sparse, flt=flt, depth=max(PREFETCH, limit)
        )
        dense_scores = dict(dense_hits)
        pool = tuple(dense_scores)
        if not pool:
            return []
        weight = settings.MEMORY_SENTENCE_WEIGHT
        previous_weight = settings.MEMORY_PREVIOUS_TURN_WEIGHT
        token_weight = settings.MEMORY_TOKEN_WEIGHT if tokens else 0.0
        modes = ["sparse"] + [WITH_PREVIOUS] * bool(previous_weight) + [SENTENCES] * bool(weight)
        modes += [TOKENS] * bool(token_weight)
        answers = self.engine.pool_scores(
            modes=modes,
            dense=dense,
            sparse=sparse,
            tokens=tokens,
            flt=replace(flt, point_ids=pool),
        )
        scored = dict(zip(modes, answers, strict=True))
        bm25_scores = dict(scored["sparse"])
        for pk, score in scored.get(WITH_PREVIOUS, []):
            bm25_scores[pk] = bm25_scores.get(pk, 0.0) + previous_weight * score
        if SENTENCES in scored:
            best_sentence = dict(scored[SENTENCES])
            dense_scores = {
                pk: (1 - weight) * score + weight * best_sentence.get(pk, score)
                for pk, score in dense_scores.items()
            }
        signals, weights = [dense_scores, bm25_scores], [1.0, 1.0]
        if token_hits := scored.get(TOKENS):
            token_scores = dict(token_hits)
            unscored = float(np.mean(list(token_scores.values())))  # stored without tokens
            signals.append({pk: token_scores.get(pk, unscored) for pk in pool})
            weights.append(token_weight)
        fused = fuse_z_scores(pool, signals, weights)
        if neighbour_weight := settings.MEMORY_NEIGHBOUR_WEIGHT:
            fused = neighbour_context(fused, places, neighbour_weight)
        if session_diversity is None:
            session_diversity = settings.MEMORY_SESSION_DIVERSITY
        if session_diversity:
            fused = diversify_sessions(fused, places, session_diversity)
        return fused

    def close(self) -> None:
        self.engine.close()


def fuse_z_scores(
    pool: Sequence[Key], scores: Sequence[dict[Key, float]], weights: Sequence[float] = ()
) -> list[tuple[Key, float]]:
    """Rank `pool` by the sum over modes of each item's z-score among the pool, times the mode's
    weight (1 when `weights` is empty); an item a mode did not score (BM25: no query term)
    scores 0 there. A mode whose scores are all equal tells nothing and adds 0. Ties keep the
    pool's order."""
    fused = np.zeros(len(pool))
    for scored, weight in zip(scores, weights or [1.0] * len(scores), strict=True):
        values = np.array([scored.get(pk, 0.0) for pk in pool])
        spread = values.std()
        if spread > 0:
            fused += weight * (values - values.mean()) / spread
    order = np.argsort(-fused, kind="stable")
    return [(pool[i], float(fused[i])) for i in order]


# Neighbour context (hybrid search): a turn of a conversation is often found through the turns
# around it (the question names what the previous turn said, the answer is in the next). Each
# episodic hit with a session and a position gains MEMORY_NEIGHBOUR_WEIGHT (a setting, 0.3) times
# how far the better of its two adjacent items (same session, position one before or after)
# scores above the lowest fused score of the pool, plus half the same for the better of the two
# items two places away. The pool is every candidate the hybrid search pooled (each mode's top
# PREFETCH), and each pooled point's place comes back with it from the engine (its payload), so
# the search asks the DB nothing for it. An item outside the pool adds nothing, so other items
# (no session, or not episodic: _pool) rank as fused. Measured by bench/levers.py on
# LoCoMo (turn R@10 / strict / session R@10): none 0.751 / 0.676 / 0.945; adjacent items among
# the pool's top 50 only (the first version) 0.773 / 0.703 / 0.938; over the whole pool 0.787 /
# 0.718 / 0.939; with the items two away at half the weight 0.798 / 0.731 / 0.937. SciFact is
# unchanged (no sessions). 0.3 is the best of 0.2 to 0.5.


def neighbour_context(
    hits: Sequence[tuple[Key, float]], places: dict[Key, Place], weight: float
) -> list[tuple[Key, float]]:
    """`hits` (point id, fused score) re-scored by their adjacent items' scores, best first;
    `places` holds each hit's (session, position) when it has both."""
    if not hits:
        return []
    floor = min(score for _, score in hits)
    score_at = {places[pk]: score for pk, score in hits if pk in places}

    def best_at(session: str, position: int, distance: int) -> float:
        """How far the better of the items `distance` places before and after scores above
        the floor (0 when neither is in the pool)."""
        return (
            max(
                score_at.get((session, position - distance), floor),
                score_at.get((session, position + distance), floor),
            )
            - floor
        )

    rescored = []
    for pk, score in hits:
        if pk in places:
            session, position = places[pk]
            score += weight * (best_at(session, position, 1) + best_at(session, position, 2) / 2)
        rescored.append((pk, score))
    # Stable: hits that gain nothing keep the fused order among themselves.
    return sorted(rescored, key=lambda hit: hit[1], reverse=True)


def index_rows(items: QuerySet[MemoryItem]) -> QuerySet[Any]:
    """ROW_FIELDS of `items` and the content of the item one position before each in its
    session (None when there is none): what _point makes a point of."""
    previous = MemoryItem.objects.filter(
        agent_id=OuterRef("agent_id"),
        session_id=OuterRef("session_id"),
        position=OuterRef("position") - 1,
    ).values("content")[:1]
    return (
        items.annotate(previous_content=Subquery(previous))
        .values_list(*ROW_FIELDS, "previous_content")
        .order_by()
    )


def next_turns(turns: Iterable[Turn]) -> list[uuid.UUID]:
    """The ids of the items one position after each of `turns` in their sessions. Asked a few
    sessions at a time: a catch-up after a long pause can touch thousands, and SQLite refuses an
    expression more than 1,000 deep or more than 32,766 parameters."""
    after: dict[tuple[str, str], set[int]] = defaultdict(set)
    for agent, session, position in turns:
        after[(agent, session)].add(position + 1)
    terms = [
        Q(agent_id=agent, session_id=session, position__in=some)
        for (agent, session), positions in after.items()
        for some in batched(sorted(positions), 200)
    ]
    found: list[uuid.UUID] = []
    for group in batched(terms, 100):
        match = functools.reduce(operator.or_, group)
        found += MemoryItem.objects.filter(match).values_list("pk", flat=True)
    return found


# Session diversity (hybrid search): the neighbour context and the previous-turn words lift the
# turns around a strong hit, which gathers the top 10 into fewer sessions (6.6 distinct on
# LoCoMo without them, 5.3 with), so a question whose answer lies in a session of its own finds
# it further down. The ranking is made again greedily: each hit of a session (as the neighbour
# context reads it) already ranked above it costs MEMORY_SESSION_DIVERSITY (0.25) standard
# deviations of the pool's scores, or the request's `session_diversity`; that lowered score is
# the hit's `score`, so scores still fall with the rank. Measured by bench/levers.py on LoCoMo
# with the previous-turn words: turn recall@10 0.824 -> 0.815, strict 0.755 -> 0.746, session
# 0.941 -> 0.946 at 0.1 (BM25 alone: 0.941); 0.05 and 0.2 gave 0.944 and 0.951 for turn recall
# 0.820 and 0.806. The token MaxSim lifts the turns that answer, which leaves room for more:
# with it, 0.25 (the default since) gave 0.816 / 0.747 / 0.960 through the service. A search
# for the sessions rather than the turns asks for more: 1.0 gave session recall 0.973 for turn
# recall 0.753. SciFact has no sessions.


def diversify_sessions(
    hits: Sequence[tuple[Key, float]], places: dict[Key, Place], penalty: float
) -> list[tuple[Key, float]]:
    """`hits` (best first) ranked again, each hit of a session less `penalty` standard
    deviations of their scores per hit of its session ranked before it; ties keep their order."""
    step = penalty * float(np.std([score for _, score in hits])) if places else 0.0
    if not step:
        return list(hits)
    # Greedy, lazily: a hit's key is its score as it was when queued, which only falls as its
    # session gains hits, so a popped hit whose key is still its score is the best left.
    queue = [(-score, order) for order, (_, score) in enumerate(hits)]
    heapq.heapify(queue)
    ranked: dict[str, int] = defaultdict(int)
    out = []
    while queue:
        key, order = heapq.heappop(queue)
        pk, score = hits[order]
        session = places[pk][0] if pk in places else None
        if session is not None:
            score -= step * ranked[session]
            if score < -key:
                heapq.heappush(queue, (-score, order))
                continue
            ranked[session] += 1
        out.append((pk, score))
    return out


def _request_batches(points: list[IndexPoint]) -> Iterable[list[IndexPoint]]:
    """`points` in runs of at most REQUEST_NUMBERS vector components (one point alone may
    exceed it): a Qdrant server refuses a request over 32 MB by default. The client's JSON
    spells a component in about 20 characters (a float's), and a catch-up's chunk of 256
    abstracts holds 25 million components, most of them the token vectors': about 500 MB in
    one request (256 turns: about 85 MB)."""
    batch: list[IndexPoint] = []
    numbers = 0
    for point in points:
        size = len(point.dense) * (1 + len(point.sentences) + len(point.tokens))
        if batch and numbers + size > REQUEST_NUMBERS:
            yield batch
            batch, numbers = [], 0
        batch.append(point)
        numbers += size
    if batch:
        yield batch


def _point(row: tuple[Any, ...], model: str) -> IndexPoint:
    (
        pk,
        agent,
        session,
        kind,
        tags,
        importance,
        sensitivity,
        created,
        expires,
        content,
        embedding,
        made_by,
        sentence_embeddings,
        token_embeddings,
        position,
        previous,
    ) = row
    if made_by != model:
        raise EmbeddingModelMismatch(made_by, model)
    payload: dict[str, Any] = {
        "agent_id": agent,
        "session_id": session,
        "kind": kind,
        "tags": tags,
        "importance": importance,
        "created_at": created.timestamp(),
    }
    if position is not None:
        payload["position"] = position
    if expires is not None:
        payload["expires_at"] = expires.timestamp()
    if rank := sensitivity_rank(sensitivity):
        payload["sensitivity"] = rank
    dense = np.frombuffer(bytes(embedding), dtype=np.float32).tolist()
    sentences = np.frombuffer(bytes(sentence_embeddings), dtype=np.float32).reshape(-1, len(dense))
    bm25 = get_embedder().sparse_document
    with_previous = (
        bm25(f"{content} {previous}") if previous and kind == MemoryItem.Kind.EPISODIC else None
    )
    tokens = token_vectors(bytes(token_embeddings), len(dense))
    return IndexPoint(pk, dense, bm25(content), payload, sentences.tolist(), tokens, with_previous)


def _fingerprint(model: str) -> str:
    """What made an index: the embedding model and INDEX_LAYOUT."""
    return f"{model} {INDEX_LAYOUT}"


class EmbeddingModelMismatch(Unavailable):
    def __init__(self, stored: str, configured: str) -> None:
        super().__init__(
            f"Memory items were embedded with '{stored}' but FASTEMBED_MODEL is "
            f"'{configured}'; run `manage.py memory_reindex` to re-embed them.",
            stored_model=stored,
            configured_model=configured,
        )


def _make_engine() -> Engine:
    if settings.QDRANT_URL:
        from qdrant_client import QdrantClient

        client = (
            QdrantClient(location=":memory:")
            if settings.QDRANT_URL == ":memory:"
            else QdrantClient(url=settings.QDRANT_URL, timeout=5)
        )
        return ServerEngine(client, settings.QDRANT_COLLECTION)
    return EdgeEngine(settings.DATA_DIR / "qdrant-edge")


_index: Any = None  # VectorIndex, or RemoteVectorIndex (memory.index_server)
_index_lock = threading.Lock()


def get_vector_index() -> Any:
    """This process's index: its own (in-process), or the index servers' when
    VECTOR_INDEX_SERVERS is set on the embedded engine. Both answer catch_up, search, rebuild,
    cursor, engine_name and close."""
    global _index
    with _index_lock:
        if _index is None:
            if settings.VECTOR_INDEX_SERVERS and not settings.QDRANT_URL:
                from .index_server import RemoteVectorIndex

                _index = RemoteVectorIndex(settings.VECTOR_INDEX_SERVERS)
            else:
                _index = VectorIndex(_make_engine())
        return _index


def set_vector_index(index: VectorIndex) -> None:
    """Make `index` this process's index (an index server's own)."""
    global _index
    with _index_lock:
        _index = index


def reset_vector_index() -> None:
    """Close this process's index (tests, reindex); the next use opens it again."""
    global _index
    with _index_lock:
        if _index is not None:
            _index.close()
        _index = None
