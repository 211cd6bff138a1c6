"""Every write of long-term memory. Each write transaction takes one "memory" revision, and
the vector index catches up from it (memory.vector_index)."""

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q, QuerySet
from django.utils import timezone

from ferrum_memory.core.exceptions import Conflict, NotFound, ServiceError
from ferrum_memory.core.iterables import batched
from ferrum_memory.core.revisions import (
    delete_all,
    revision_delete,
    revision_delete_all,
    revision_purge_expired,
    revision_state,
    revision_take,
)

from .embeddings import ItemVectors, get_embedder, sentences
from .models import (
    REVISION,
    MemoryEvent,
    MemoryItem,
    MemoryTombstone,
    WordPieceCounts,
    sensitivity_rank,
)
from .selectors import forget_word_piece_idf
from .vector_index import EmbeddingModelMismatch, SearchFilter, get_vector_index

logger = logging.getLogger(__name__)
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


def _near_duplicate(
    agent_id: str, vector: np.ndarray, now: datetime, exclude: Any = None
) -> str | None:
    """The point id of the agent's most similar memory (other than `exclude`) when it is
    similar enough, via the index.

    Without the index (down), only exact duplicates are merged: a near duplicate is stored."""
    try:
        hits = get_vector_index().search(
            mode="dense",
            dense=vector.tolist(),
            sparse=get_embedder().sparse_query(""),
            flt=SearchFilter(agent_id=agent_id, now=now.timestamp()),
            limit=2,
        )
    except Exception as exc:  # noqa: BLE001 - the index being down must not fail a store
        logger.warning("near-duplicate check skipped, vector index unavailable: %s", exc)
        return None
    hits = [hit for hit in hits if str(hit[0]) != str(exclude)]
    if hits and hits[0][1] >= settings.MEMORY_NEAR_DUPLICATE:
        return str(hits[0][0])
    return None


# What an item's history shows of it: every field a client sets.
HISTORY_FIELDS = (
    "content",
    "kind",
    "source",
    "importance",
    "sensitivity",
    "tags",
    "metadata",
    "session_id",
    "expires_at",
)


def _snapshot(item: MemoryItem) -> dict[str, Any]:
    values = {field: getattr(item, field) for field in HISTORY_FIELDS}
    if values["expires_at"] is not None:
        values["expires_at"] = values["expires_at"].isoformat()
    return values


def _diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        field: {"before": before.get(field), "after": value}
        for field, value in after.items()
        if before.get(field) != value
    }


def _event(
    item: MemoryItem, kind: str, *, actor: str, at: datetime, changes: dict[str, Any], **extra: Any
) -> MemoryEvent:
    fields = {"point_id": item.pk, "agent_id": item.agent_id, "version": item.version}
    return MemoryEvent(**(fields | extra), kind=kind, at=at, actor=actor, changes=changes)


def memory_store_many(
    *, items: Sequence[dict[str, Any]], now: datetime | None = None, actor: str = ""
) -> list[StoredMemory]:
    """Store validated memory dicts, embedded in one batch. An exact or near duplicate of one of
    the agent's memories (or of an earlier item in the batch) is merged into it: importance
    raised to the larger, access counted, tags joined; no second copy. Each new item and each
    merge is an event of the item's history, by `actor` (an API key's name)."""
    now = now or timezone.now()
    memory_check_model()
    embedder = get_embedder()
    contents = [item["content"] for item in items]
    embedded = embedder.embed_items(contents)
    near = [
        _near_duplicate(item["agent_id"], embedded.vectors[i], now) for i, item in enumerate(items)
    ]
    with transaction.atomic():
        results = _store_rows(items, embedded, near, now, embedder.model_name, actor)
    indexed = memory_index_now()
    return [StoredMemory(item, duplicate, indexed) for item, duplicate in results]


def _live(now: datetime) -> QuerySet[MemoryItem]:
    return MemoryItem.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))


def _store_rows(
    items: Sequence[dict[str, Any]],
    embedded: ItemVectors,
    near: list[str | None],
    now: datetime,
    model: str,
    actor: str,
) -> list[tuple[MemoryItem, str]]:
    revision = revision_take(name=REVISION)
    results: list[tuple[MemoryItem, str]] = []
    events: list[MemoryEvent] = []
    stored_in_batch: list[tuple[str, np.ndarray, MemoryItem]] = []
    next_position: dict[tuple[str, str], int] = {}
    for item, vector, sentence_blob, token_blob, near_id in zip(
        items, embedded.vectors, embedded.sentences, embedded.tokens, near, strict=True
    ):
        digest = content_hash(item["content"])
        # Live items only, as the near-duplicate search: merged into an expired item (which
        # the purge deletes next), a store would answer 201 for a memory already gone.
        target = _live(now).filter(agent_id=item["agent_id"], content_hash=digest).first()
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
            before = _snapshot(target)
            _merge(target, item, revision, now)
            changes = _diff(before, _snapshot(target))
            events.append(
                _event(target, MemoryEvent.Kind.MERGED_FROM, actor=actor, at=now, changes=changes)
            )
            results.append((target, duplicate))
            continue
        ttl = item.get("ttl_seconds", settings.DEFAULT_MEMORY_TTL)
        session = item.get("session_id", "")
        position = None
        if session:
            key = (item["agent_id"], session)
            if key not in next_position:
                next_position[key] = _session_end(*key)
            position = next_position[key]
            next_position[key] += 1
        row = MemoryItem.objects.create(
            agent_id=item["agent_id"],
            session_id=session,
            position=position,
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
            sentence_embeddings=sentence_blob,
            token_embeddings=token_blob,
            embedding_model=model,
            revision=revision,
        )
        stored_in_batch.append((item["agent_id"], vector, row))
        results.append((row, ""))
        kind = (
            MemoryEvent.Kind.CONSOLIDATED
            if row.source == MemoryItem.Source.CONSOLIDATION
            else MemoryEvent.Kind.CREATED
        )
        events.append(_event(row, kind, actor=actor, at=now, changes=_diff({}, _snapshot(row))))
    MemoryEvent.objects.bulk_create(events)
    return results


def _session_end(agent_id: str, session_id: str) -> int:
    """The position after the last of a session's items (0 for a new session). A merged
    duplicate keeps its own position: a session's positions may have gaps, never repeats
    within one writer."""
    last = MemoryItem.objects.filter(agent_id=agent_id, session_id=session_id).aggregate(
        last=Max("position")
    )["last"]
    return 0 if last is None else last + 1


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
    target.version = F("version") + 1
    target.save(
        update_fields=[
            "importance",
            "sensitivity",
            "tags",
            "access_count",
            "last_accessed_at",
            "revision",
            "version",
        ]
    )
    target.refresh_from_db(fields=["access_count", "version"])
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


def _record_gone(kind: str, actor: str, at: datetime) -> Any:
    """revision_delete's `record`: each deleted item's last history event."""

    def record(doomed: list[tuple[Any, str]]) -> None:
        MemoryEvent.objects.bulk_create(
            MemoryEvent(point_id=pk, agent_id=agent, kind=kind, at=at, actor=actor)
            for pk, agent in doomed
        )

    return record


def memory_delete_many(*, queryset: QuerySet[MemoryItem], actor: str = "") -> int:
    """Delete items (tombstones for the indexes); their history keeps a `deleted` event."""
    record = _record_gone(MemoryEvent.Kind.DELETED, actor, timezone.now())
    return revision_delete(queryset=queryset, tombstone=MemoryTombstone, record=record)


def memory_purge_expired(*, now: datetime | None = None) -> int:
    """Delete expired memory items in chunks, then tombstones older than the retention."""
    now = now or timezone.now()
    return revision_purge_expired(
        model=MemoryItem,
        tombstone=MemoryTombstone,
        now=now,
        chunk=PURGE_CHUNK,
        record=_record_gone(MemoryEvent.Kind.EXPIRED, "", now),
    )


def memory_erase_agent(*, agent_id: str) -> dict[str, int]:
    """Delete every memory item of the agent (tombstones for the indexes, no history: the
    history goes too). Chunked, so that it is complete in one call whatever the count."""
    items = revision_delete_all(
        queryset=MemoryItem.objects.filter(agent_id=agent_id),
        tombstone=MemoryTombstone,
        chunk=PURGE_CHUNK,
    )
    events = delete_all(MemoryEvent.objects.filter(agent_id=agent_id), chunk=PURGE_CHUNK)
    return {"memory_items": items, "memory_events": events}


class StaleVersion(Conflict):
    def __init__(self, current: int) -> None:
        super().__init__(
            f"The item is at version {current}: read it again, then send that version.",
            current_version=current,
        )


# The fields PATCH /memory/{point_id} may set, besides content and ttl_seconds.
UPDATABLE = ("importance", "sensitivity", "tags", "metadata")


def memory_update(
    *,
    item: MemoryItem,
    version: int,
    changes: dict[str, Any],
    actor: str = "",
    now: datetime | None = None,
) -> StoredMemory:
    """Change an item read by the caller, if it is still at `version` (else StaleVersion).

    New content is re-embedded and indexed before this returns, as a store is. When it
    duplicates another of the agent's items (exactly, or near), the item is merged into that
    one (importance, sensitivity and tags kept at the larger) and deleted: the answer is the
    other item, and both histories say so."""
    now = now or timezone.now()
    content = changes.get("content")
    near_id, embedded = None, None
    embedder = get_embedder()
    if content is not None and content != item.content:
        memory_check_model()
        embedded = embedder.embed_items([content])
        near_id = _near_duplicate(item.agent_id, embedded.vectors[0], now, exclude=item.pk)
    with transaction.atomic():
        # The revision first: its row lock orders this write after any other, so the version
        # read next is the committed one (SQLite could not upgrade an older read snapshot).
        revision = revision_take(name=REVISION)
        row = MemoryItem.objects.filter(pk=item.pk).first()
        if row is None:
            raise NotFound(f"No memory item '{item.pk}'.")
        if row.version != version:
            raise StaleVersion(row.version)
        before = _snapshot(row)
        for field in UPDATABLE:
            if field in changes:
                setattr(row, field, changes[field])
        row.tags = sorted(set(row.tags))
        if "ttl_seconds" in changes:
            ttl = changes["ttl_seconds"]
            row.expires_at = now + timedelta(seconds=ttl) if ttl else None
        if embedded is not None:
            digest = content_hash(content or "")
            target = (
                _live(now)
                .filter(agent_id=row.agent_id, content_hash=digest)
                .exclude(pk=row.pk)
                .first()
            )
            duplicate = "exact" if target else ""
            if target is None and near_id:
                target = MemoryItem.objects.filter(pk=near_id).exclude(pk=row.pk).first()
                duplicate = "near" if target else ""
            if target is not None:
                merged = _merge_into(row, target, revision, now, actor, before)
                return StoredMemory(merged, duplicate, memory_index_now())
            row.content = content or ""
            row.content_hash = digest
            row.embedding = embedded.vectors[0].astype("<f4").tobytes()
            row.sentence_embeddings = embedded.sentences[0]
            row.token_embeddings = embedded.tokens[0]
            row.embedding_model = embedder.model_name
        changed = _diff(before, _snapshot(row))
        if not changed:
            return StoredMemory(row, "", True)
        row.version += 1
        row.revision = revision
        row.save()
        _event(row, MemoryEvent.Kind.UPDATED, actor=actor, at=now, changes=changed).save()
    return StoredMemory(row, "", memory_index_now())


def _merge_into(
    row: MemoryItem,
    target: MemoryItem,
    revision: int,
    now: datetime,
    actor: str,
    before: dict[str, Any],
) -> MemoryItem:
    """`row`, changed as asked, duplicates `target`: fold it in and delete it."""
    target_before = _snapshot(target)
    _merge(
        target,
        {"importance": row.importance, "sensitivity": row.sensitivity, "tags": row.tags},
        revision,
        now,
    )
    asked = _diff(before, _snapshot(row))
    MemoryEvent.objects.bulk_create(
        [
            _event(
                target,
                MemoryEvent.Kind.MERGED_FROM,
                actor=actor,
                at=now,
                changes=_diff(target_before, _snapshot(target)),
                other_point_id=row.pk,
            ),
            _event(
                row,
                MemoryEvent.Kind.MERGED_INTO,
                actor=actor,
                at=now,
                changes=asked,
                other_point_id=target.pk,
                version=None,
            ),
        ]
    )
    revision_delete(queryset=MemoryItem.objects.filter(pk=row.pk), tombstone=MemoryTombstone)
    return target


def memory_reindex(*, batch: int = 64) -> int:
    """Re-embed every item whose model is not the configured one, embed the sentences and the
    tokens of items stored before their vectors were kept, then rebuild the index."""
    from .vector_index import reset_vector_index

    embedder = get_embedder()
    redone = 0
    while rows := list(
        MemoryItem.objects.exclude(embedding_model=embedder.model_name).values_list(
            "id", "content"
        )[:batch]
    ):
        embedded = embedder.embed_items([content for _, content in rows])
        with transaction.atomic():
            revision = revision_take(name=REVISION)
            for (pk, _), vector, sentence_blob, token_blob in zip(
                rows, embedded.vectors, embedded.sentences, embedded.tokens, strict=True
            ):
                MemoryItem.objects.filter(pk=pk).update(
                    embedding=vector.astype("<f4").tobytes(),
                    sentence_embeddings=sentence_blob,
                    token_embeddings=token_blob,
                    embedding_model=embedder.model_name,
                    revision=revision,
                )
        redone += len(rows)
    _fill_sentence_vectors(batch)
    _fill_token_vectors(batch)
    memory_count_word_pieces()
    reset_model_check()
    get_vector_index().rebuild()  # drop whatever it held and refill it from the DB
    reset_vector_index()
    return redone


def _fill_sentence_vectors(batch: int) -> None:
    """Sentence vectors for the items stored before items kept them (an item of one sentence
    has none, and is left as it is)."""
    embed = get_embedder().embed_sentences
    _fill_missing("sentence_embeddings", embed, batch, lambda text: len(sentences(text)) > 1)


def _fill_token_vectors(batch: int) -> None:
    """Token vectors for the items stored before items kept them. A model that gives no token
    states leaves them empty: nothing to fill, and nothing embedded again to find that out."""
    embedder = get_embedder()
    if embedder.gives_token_states:
        _fill_missing("token_embeddings", embedder.embed_tokens, batch, lambda text: True)


def _fill_missing(
    field: str,
    embed: Callable[[list[str]], list[bytes]],
    batch: int,
    wanted: Callable[[str], bool],
) -> None:
    """Fill `field`, a blob, where it is empty and `wanted(content)`, by `embed`, `batch`
    items at a time. An item whose content changed meanwhile got its own blob: kept."""
    empty = MemoryItem.objects.filter(**{field: b""}).values_list("id", "content_hash", "content")
    rows = [(pk, digest, text) for pk, digest, text in empty.iterator() if wanted(text)]
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        blobs = embed([text for _, _, text in chunk])
        with transaction.atomic():
            revision = revision_take(name=REVISION)
            for (pk, digest, _), blob in zip(chunk, blobs, strict=True):
                MemoryItem.objects.filter(pk=pk, content_hash=digest, **{field: b""}).update(
                    **{field: blob}, revision=revision
                )


def memory_count_word_pieces(*, batch: int = 512) -> bool:
    """Count how many items hold each word piece (WordPieceCounts), unless the items are as
    they were at the last count; True when it counted. An item stored meanwhile may or may not
    be counted: the next count, its revision having moved, takes it in."""
    embedder = get_embedder()
    revision = revision_state(name=REVISION)[0]
    if WordPieceCounts.objects.filter(
        embedding_model=embedder.model_name, revision=revision
    ).exists():
        return False
    counts = np.zeros(embedder.vocabulary_size, dtype=np.int64)
    items = 0
    texts = MemoryItem.objects.values_list("content", flat=True).order_by()
    for chunk in batched(texts.iterator(chunk_size=batch), batch):
        held = np.concatenate([np.unique(ids) for ids in embedder.piece_ids(chunk)])
        counts += np.bincount(held, minlength=len(counts))[: len(counts)]
        items += len(chunk)
    WordPieceCounts.objects.update_or_create(
        embedding_model=embedder.model_name,
        defaults={
            "items": items,
            "counts": counts.astype("<i4").tobytes(),
            "revision": revision,
            "counted_at": timezone.now(),
        },
    )
    forget_word_piece_idf()  # this process searches by the new count at once
    return True


class RerankUnavailable(ServiceError):
    pass
