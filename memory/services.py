"""Every write of long-term memory. Each write transaction takes one "memory" revision, and
the vector index catches up from it (memory.vector_index)."""

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from ferrum_memory.core.exceptions import ServiceError
from ferrum_memory.core.revisions import revision_purge_tombstones, revision_take

from .embeddings import get_embedder
from .models import MemoryItem, MemoryTombstone, sensitivity_rank
from .vector_index import EmbeddingModelMismatch, SearchFilter, get_vector_index

logger = logging.getLogger(__name__)
REVISION = "memory"
PURGE_CHUNK = 2_000


def content_hash(content: str) -> str:
    """Exact duplicates ignore case and runs of white space."""
    return hashlib.sha256(" ".join(content.lower().split()).encode()).hexdigest()


@dataclass(frozen=True)
class StoredMemory:
    item: MemoryItem
    duplicate: str  # "", "exact" or "near": merged into `item` instead of stored again
    indexed: bool


# The configured model is fixed for a process's life, so one clean check per process suffices;
# it scans the table, which one store per call could not afford at 10^5 items.
_model_checked = False


def memory_check_model() -> None:
    """Refuse to mix vector spaces: every stored item must come from the configured model."""
    global _model_checked
    if _model_checked:
        return
    model = get_embedder().model_name
    other = (
        MemoryItem.objects.exclude(embedding_model=model)
        .values_list("embedding_model", flat=True)
        .first()
    )
    if other is not None:
        raise EmbeddingModelMismatch(other, model)
    _model_checked = True


def reset_model_check() -> None:
    """Check again on the next store (tests; memory_reindex)."""
    global _model_checked
    _model_checked = False


def _near_duplicate(agent_id: str, vector: np.ndarray, now: datetime) -> str | None:
    """The point id of the agent's most similar memory when it is similar enough, via the index.

    Without the index (down), only exact duplicates are merged: a near duplicate is stored."""
    try:
        hits = get_vector_index().search(
            mode="dense",
            dense=vector.tolist(),
            sparse=get_embedder().sparse_query(""),
            flt=SearchFilter(agent_id=agent_id, now=now.timestamp()),
            limit=1,
        )
    except Exception as exc:  # noqa: BLE001 - the index being down must not fail a store
        logger.warning("near-duplicate check skipped, vector index unavailable: %s", exc)
        return None
    if hits and hits[0][1] >= settings.MEMORY_NEAR_DUPLICATE:
        return str(hits[0][0])
    return None


def memory_store_many(
    *, items: Sequence[dict[str, Any]], now: datetime | None = None
) -> list[StoredMemory]:
    """Store validated memory dicts, embedded in one batch. An exact or near duplicate of one of
    the agent's memories (or of an earlier item in the batch) is merged into it: importance
    raised to the larger, access counted, tags joined; no second copy."""
    now = now or timezone.now()
    memory_check_model()
    embedder = get_embedder()
    vectors = embedder.embed_documents([item["content"] for item in items])
    near = [_near_duplicate(item["agent_id"], vectors[i], now) for i, item in enumerate(items)]
    with transaction.atomic():
        results = _store_rows(items, vectors, near, now, embedder.model_name)
    indexed = memory_index_now()
    return [StoredMemory(item, duplicate, indexed) for item, duplicate in results]


def _store_rows(
    items: Sequence[dict[str, Any]],
    vectors: np.ndarray,
    near: list[str | None],
    now: datetime,
    model: str,
) -> list[tuple[MemoryItem, str]]:
    revision = revision_take(name=REVISION)
    results: list[tuple[MemoryItem, str]] = []
    stored_in_batch: list[tuple[str, np.ndarray, MemoryItem]] = []
    for item, vector, near_id in zip(items, vectors, near, strict=True):
        digest = content_hash(item["content"])
        target = MemoryItem.objects.filter(agent_id=item["agent_id"], content_hash=digest).first()
        duplicate = "exact" if target else ""
        if target is None:
            target = next(
                (
                    row
                    for agent, other, row in stored_in_batch
                    if agent == item["agent_id"]
                    and float(other @ vector) >= settings.MEMORY_NEAR_DUPLICATE
                ),
                None,
            )
            if target is None and near_id:
                target = MemoryItem.objects.filter(pk=near_id).first()
            duplicate = "near" if target else ""
        if target is not None:
            results.append((_merge(target, item, revision, now), duplicate))
            continue
        ttl = item.get("ttl_seconds", settings.DEFAULT_MEMORY_TTL)
        row = MemoryItem.objects.create(
            agent_id=item["agent_id"],
            session_id=item.get("session_id", ""),
            kind=item.get("kind", MemoryItem.Kind.EPISODIC),
            source=item.get("source", MemoryItem.Source.AGENT),
            content=item["content"],
            content_hash=digest,
            importance=item.get("importance", 0.5),
            sensitivity=item.get("sensitivity", MemoryItem.Sensitivity.NONE),
            tags=sorted(set(item.get("tags", []))),
            metadata=item.get("metadata", {}),
            created_at=now,
            expires_at=now + timedelta(seconds=ttl) if ttl else None,
            embedding=vector.astype("<f4").tobytes(),
            embedding_model=model,
            revision=revision,
        )
        stored_in_batch.append((item["agent_id"], vector, row))
        results.append((row, ""))
    return results


def _merge(target: MemoryItem, item: dict[str, Any], revision: int, now: datetime) -> MemoryItem:
    target.importance = max(target.importance, item.get("importance", 0.5))
    # A copy marked more sensitive makes the item so: merging never lowers a mark.
    target.sensitivity = max(
        target.sensitivity,
        item.get("sensitivity", MemoryItem.Sensitivity.NONE),
        key=sensitivity_rank,
    )
    target.tags = sorted(set(target.tags) | set(item.get("tags", [])))
    target.access_count = F("access_count") + 1
    target.last_accessed_at = now
    target.revision = revision
    target.save(
        update_fields=[
            "importance",
            "sensitivity",
            "tags",
            "access_count",
            "last_accessed_at",
            "revision",
        ]
    )
    target.refresh_from_db(fields=["access_count"])
    return target


def memory_index_now() -> bool:
    """Read-your-writes: bring this process's index up to the DB. False when it is down; the
    items are then indexed by a later catch-up (any search, or the beat task)."""
    try:
        get_vector_index().catch_up()
    except Exception as exc:  # noqa: BLE001 - the write is safe in the DB whatever the index says
        logger.warning("vector index unavailable, items will be indexed later: %s", exc)
        return False
    return True


@transaction.atomic
def memory_delete_many(*, queryset: QuerySet[MemoryItem]) -> int:
    revision = revision_take(name=REVISION)
    doomed = list(queryset.values_list("id", "agent_id"))
    MemoryTombstone.objects.bulk_create(
        [MemoryTombstone(point_id=pk, agent_id=agent, revision=revision) for pk, agent in doomed],
        ignore_conflicts=True,
    )
    MemoryItem.objects.filter(id__in=[pk for pk, _ in doomed]).delete()
    return len(doomed)


def memory_purge_expired(*, now: datetime | None = None) -> int:
    """Delete expired memory items in chunks, then tombstones older than the retention."""
    now = now or timezone.now()
    deleted = 0
    while pks := list(
        MemoryItem.objects.filter(expires_at__lte=now).values_list("id", flat=True)[:PURGE_CHUNK]
    ):
        deleted += memory_delete_many(queryset=MemoryItem.objects.filter(id__in=pks))
    horizon = now - timedelta(seconds=settings.REPLAY_TOMBSTONE_RETENTION)
    revision_purge_tombstones(
        name=REVISION, tombstones=MemoryTombstone.objects.filter(deleted_at__lt=horizon)
    )
    return deleted


def memory_reindex(*, batch: int = 64) -> int:
    """Re-embed every item whose model is not the configured one, then rebuild the index."""
    from .vector_index import reset_vector_index

    embedder = get_embedder()
    redone = 0
    while rows := list(
        MemoryItem.objects.exclude(embedding_model=embedder.model_name).values_list(
            "id", "content"
        )[:batch]
    ):
        vectors = embedder.embed_documents([content for _, content in rows])
        with transaction.atomic():
            revision = revision_take(name=REVISION)
            for (pk, _), vector in zip(rows, vectors, strict=True):
                MemoryItem.objects.filter(pk=pk).update(
                    embedding=vector.astype("<f4").tobytes(),
                    embedding_model=embedder.model_name,
                    revision=revision,
                )
        redone += len(rows)
    reset_model_check()
    index = get_vector_index()
    index.engine.reset(embedder.dim)  # drop whatever it held; the catch-up refills it
    index.catch_up()
    reset_vector_index()
    return redone


class RerankUnavailable(ServiceError):
    pass
