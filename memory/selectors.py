"""Every non-trivial read of long-term memory."""

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

import numpy as np
from django.db import connection
from django.db.models import BooleanField, Count, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from ferrum_memory.core.exceptions import NotFound
from ferrum_memory.core.telemetry import traced

from .embeddings import Embedder, FloatMatrix, QueryVectors, get_embedder, get_reranker
from .models import MemoryEvent, MemoryItem, WordPieceCounts
from .vector_index import SearchFilter, get_vector_index

# Candidates a reranker reorders, per result asked for.
RERANK_POOL = 3
# How long a process uses the word pieces' counts it read before it reads them again (they are
# counted again at most every few minutes: memory.apps).
PIECE_COUNTS_READ_SECONDS = 60.0
_piece_idf_lock = threading.Lock()
_piece_idf: dict[str, tuple[float, np.ndarray | None]] = {}  # model -> (read at, IDF)


def weighted_query_tokens(embedded: QueryVectors) -> FloatMatrix:
    """The query's content tokens, each times its word piece's IDF over the items (BM25's:
    a piece few items hold counts more in the MaxSim). Before the first count
    (memory_count_word_pieces), every weight is 1."""
    idf = _word_piece_idf(get_embedder().model_name)
    # (A count made by another vocabulary under the same model name weighs nothing.)
    if idf is None or not len(embedded.tokens) or embedded.token_ids.max() >= len(idf):
        return embedded.tokens
    return (embedded.tokens * idf[embedded.token_ids][:, None]).astype(np.float32)


def _word_piece_idf(model: str) -> np.ndarray | None:
    with _piece_idf_lock:
        read_at, idf = _piece_idf.get(model, (-math.inf, None))
        if time.monotonic() - read_at < PIECE_COUNTS_READ_SECONDS:
            return idf
        row, idf = WordPieceCounts.objects.filter(embedding_model=model).first(), None
        if row is not None and row.items:
            held = np.frombuffer(bytes(row.counts), dtype="<i4").astype(np.float64)
            idf = np.log(1 + (row.items - held + 0.5) / (held + 0.5))
        _piece_idf[model] = (time.monotonic(), idf)
        return idf


def forget_word_piece_idf() -> None:
    """Read the counts again at the next search (after a count, and in tests)."""
    with _piece_idf_lock:
        _piece_idf.clear()


def memory_visible(
    *, agent_ids: Sequence[str] | None = None, now: datetime | None = None, **lookups: Any
) -> QuerySet[MemoryItem]:
    """Live items (of `agent_ids`), with `lookups` (e.g. pk=...) in the same filter(): each
    filter() call copies the query, a quarter of a lookup by primary key's CPU."""
    now = now or timezone.now()
    if agent_ids is not None:
        lookups["agent_id__in"] = agent_ids
    return MemoryItem.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), **lookups)


def memory_get(*, point_id: UUID | str, agent_ids: Sequence[str] | None = None) -> MemoryItem:
    # A slice, not first(): by primary key there is one row at most, and first()'s ORDER BY
    # costs a tenth of the query's CPU (bench/web.py's trivial request is this query).
    item = next(iter(memory_visible(agent_ids=agent_ids, pk=point_id)[:1]), None)
    if item is None:
        raise NotFound(f"No memory item '{point_id}'.")
    return item


def _has_tag(tag: str) -> RawSQL:
    """Does the item's JSON list of tags hold `tag`? Django has no such lookup on SQLite."""
    table = connection.ops.quote_name(MemoryItem._meta.db_table)
    if connection.vendor == "postgresql":
        return RawSQL(f"{table}.tags @> jsonb_build_array(%s::text)", [tag], BooleanField())
    sql = f"EXISTS (SELECT 1 FROM json_each({table}.tags) WHERE json_each.value = %s)"
    return RawSQL(sql, [tag], BooleanField())


def memory_list(
    *, agent_ids: Sequence[str] | None = None, filters: dict[str, Any]
) -> QuerySet[MemoryItem]:
    """An agent's live items, newest first; filters as GET /memory/ names them. Every tag
    given must be on the item."""
    queryset = memory_visible(agent_ids=agent_ids).defer(
        "embedding", "sentence_embeddings", "token_embeddings"
    )
    for field in ("agent_id", "session_id", "kind", "source", "sensitivity"):
        if filters.get(field):
            queryset = queryset.filter(**{field: filters[field]})
    if filters.get("created_after"):
        queryset = queryset.filter(created_at__gte=filters["created_after"])
    if filters.get("created_before"):
        queryset = queryset.filter(created_at__lte=filters["created_before"])
    for i, tag in enumerate(tag for tag in filters.get("tags") or [] if tag):
        queryset = queryset.alias(**{f"tag_{i}": _has_tag(tag)}).filter(**{f"tag_{i}": True})
    return queryset.order_by("-created_at", "-id")


def memory_history(
    *, point_id: UUID | str, agent_ids: Sequence[str] | None = None
) -> QuerySet[MemoryEvent]:
    """Every event of an item, oldest first, also once it is deleted; NotFound when there is
    none the caller may see."""
    events = MemoryEvent.objects.filter(point_id=point_id)
    if agent_ids is not None:
        events = events.filter(agent_id__in=agent_ids)
    if not events.exists():
        raise NotFound(f"No memory item '{point_id}' has a history.")
    return events.order_by("id")


def _live(item: MemoryItem, now: datetime) -> bool:
    return item.expires_at is None or item.expires_at > now


# Relevance: how likely a hit is about the query, from two absolute signals (unlike the fused
# score, which only ranks a pool against itself): the cosine of the query and item embeddings,
# and the share of the query's BM25 terms the item contains. Their weighed sum is mapped through
# a logistic curve whose midpoint (relevance 0.5, CONTEXT_MIN_RELEVANCE's default) is the point
# of the trade-off that bench/context.py --fit chose on LoCoMo: each question asked of its own
# conversation (an evidence session's turn must stay) and of another one (no hit may stay). The
# slope is fitted there too, by logistic regression of evidence turns against off-topic hits.
RELEVANCE_TERM_WEIGHT = 0.4
RELEVANCE_MIDPOINT = 0.56
RELEVANCE_SLOPE = 27.1


def relevance(cosine: float, term_share: float) -> float:
    evidence = cosine + RELEVANCE_TERM_WEIGHT * term_share - RELEVANCE_MIDPOINT
    return 1.0 / (1.0 + math.exp(-RELEVANCE_SLOPE * evidence))


def term_share(embedder: Embedder, query_terms: set[int], content: str) -> float:
    """The share of the query's distinct BM25 terms (stemmed, stopwords out) in `content`;
    0 for a query of stopwords only."""
    if not query_terms:
        return 0.0
    return len(query_terms & set(embedder.sparse_document(content).indices)) / len(query_terms)


@dataclass(frozen=True)
class MemoryHit:
    item: MemoryItem
    score: float
    relevance: float
    # The evidence `relevance` is made of, for calibration (bench/context.py).
    cosine: float
    term_share: float


@traced(
    "memory.search",
    lambda **call: {
        "agent_id": call["agent_id"],
        "mode": call.get("mode", "hybrid"),
        "limit": call.get("limit", 10),
        "rerank": call.get("rerank", False),
    },
    result_count=len,
)
def memory_search(
    *,
    query: str,
    agent_id: str,
    limit: int = 10,
    mode: str = "hybrid",
    kinds: Sequence[str] = (),
    tags: Sequence[str] = (),
    session_id: str = "",
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    min_importance: float | None = None,
    max_sensitivity: str = "",
    min_relevance: float = 0.0,
    session_diversity: float | None = None,
    rerank: bool = False,
) -> list[MemoryHit]:
    """Hybrid (dense, BM25 and the word pieces' MaxSim, z-score fusion), dense or sparse search
    of one agent's memories: the top `limit` hits, less those whose relevance is below
    `min_relevance`. Hybrid spreads its hits over sessions by `session_diversity` (None:
    MEMORY_SESSION_DIVERSITY)."""
    reranker = get_reranker() if rerank else None
    now = timezone.now()
    embedder = get_embedder()
    flt = SearchFilter(
        agent_id=agent_id,
        now=now.timestamp(),
        kinds=list(kinds),
        tags=list(tags),
        session_id=session_id,
        created_after=created_after.timestamp() if created_after else None,
        created_before=created_before.timestamp() if created_before else None,
        min_importance=min_importance,
        max_sensitivity=max_sensitivity,
    )
    pool = limit * RERANK_POOL if reranker else limit
    # Embedded in every mode: the cosine is half of every hit's relevance.
    # The content tokens come from the same pass: only hybrid search reads them.
    embedded = embedder.embed_query_tokens(query)
    dense = embedded.vector
    sparse = embedder.sparse_query(query)
    hits = get_vector_index().search(
        mode=mode,
        dense=dense.tolist(),
        sparse=sparse,
        tokens=weighted_query_tokens(embedded).tolist() if mode == "hybrid" else (),
        flt=flt,
        limit=pool,
        session_diversity=session_diversity,
    )
    # By primary key only: with an agent filter SQLite picks the agent index and reads every
    # row the agent has. The index already filtered agent and expiry; the DB has the last word.
    rows = MemoryItem.objects.defer("sentence_embeddings", "token_embeddings").in_bulk(
        [pk for pk, _ in hits]
    )
    query_terms = set(sparse.indices)
    found = []
    for pk, score in hits:
        row = rows.get(pk)
        if row is None or row.agent_id != agent_id or not _live(row, now):
            continue
        cosine = float(np.frombuffer(bytes(row.embedding), dtype=np.float32) @ dense)
        share = term_share(embedder, query_terms, row.content)
        found.append(MemoryHit(row, score, relevance(cosine, share), cosine, share))
    if reranker is not None and found:
        scores = list(reranker.rerank(query, [hit.item.content for hit in found]))
        found = sorted(
            (replace(hit, score=float(score)) for hit, score in zip(found, scores, strict=True)),
            key=lambda hit: hit.score,
            reverse=True,
        )
    return [hit for hit in found[:limit] if hit.relevance >= min_relevance]


def memory_stats(agent_ids: Sequence[str] | None) -> dict[str, Any]:
    queryset = memory_visible(agent_ids=agent_ids)
    by_kind = dict(
        queryset.values("kind").annotate(n=Count("id")).order_by().values_list("kind", "n")
    )
    return {"count": sum(by_kind.values()), "count_by_kind": by_kind}
