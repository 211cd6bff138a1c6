"""Reads that span every app for one agent: the export."""

import base64
from collections.abc import Iterator
from typing import Any

from django.utils import timezone

from experience.models import DreamCycle, DreamCycleItem, Experience
from ferrum_memory.core.renderers import json_bytes
from memory.embeddings import get_embedder
from memory.models import MemoryEvent, MemoryItem
from sessions.models import Session
from sessions.working_memory import get_working_memory

FORMAT = "ferrum-memory-agent"
FORMAT_VERSION = 1
CHUNK = 2_000
# Memory items are read fewer at a time: with their word pieces' vectors one is 10 to 100 KB.
ITEM_CHUNK = 200

MEMORY_FIELDS = (
    "id",
    "session_id",
    "position",
    "kind",
    "source",
    "content",
    "importance",
    "sensitivity",
    "tags",
    "metadata",
    "created_at",
    "expires_at",
    "access_count",
    "last_accessed_at",
    "version",
    "embedding_model",
)
EVENT_FIELDS = ("point_id", "kind", "at", "actor", "version", "changes", "other_point_id")
EXPERIENCE_FIELDS = (
    "session_id",
    "task",
    "tool_calls",
    "test_result",
    "reward",
    "td_error",
    "priority",
    "metadata",
    "created_at",
    "expires_at",
    "times_sampled",
    "last_sampled_at",
)
CYCLE_FIELDS = (
    "number",
    "status",
    "strategy",
    "alpha",
    "beta",
    "seed",
    "buffer_size",
    "created_at",
    "completed_at",
)
DRAW_FIELDS = (
    "position",
    "experience_id",
    "probability",
    "weight",
    "td_error_before",
    "td_error_after",
)


def _line(record: dict[str, Any]) -> bytes:
    return json_bytes(record) + b"\n"


def agent_export(*, agent_id: str) -> Iterator[bytes]:
    """The agent as JSON Lines: a header (format version, embedding model), its memory items
    (each with its embedding, base64 float32), their history events, its experiences, its
    open sessions with their working memory, its dream cycles with their draws, and an end
    line with the counts, so a truncated file is told from a whole one. Read in chunks: the
    memory this takes does not grow with the agent."""
    embedder = get_embedder()
    yield _line(
        {
            "type": "header",
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "agent_id": agent_id,
            "embedding_model": embedder.model_name,
            "embedding_dim": embedder.dim,
            "exported_at": timezone.now(),
        }
    )
    counts = dict.fromkeys(
        ("memory_items", "memory_events", "experiences", "sessions", "dream_cycles"), 0
    )
    items = MemoryItem.objects.filter(agent_id=agent_id).order_by("created_at", "id")
    vectors = ("embedding", "sentence_embeddings", "token_embeddings")
    for row in items.values(*MEMORY_FIELDS, *vectors).iterator(chunk_size=ITEM_CHUNK):
        for field in vectors:
            row[field] = base64.b64encode(bytes(row[field])).decode()
        counts["memory_items"] += 1
        yield _line({"type": "memory", **row})
    events = MemoryEvent.objects.filter(agent_id=agent_id).order_by("id")
    for row in events.values(*EVENT_FIELDS).iterator(chunk_size=CHUNK):
        counts["memory_events"] += 1
        yield _line({"type": "memory_event", **row})
    experiences = Experience.objects.filter(agent_id=agent_id).order_by("id")
    for row in experiences.values("experience_id", *EXPERIENCE_FIELDS).iterator(chunk_size=CHUNK):
        counts["experiences"] += 1
        yield _line({"type": "experience", "id": row.pop("experience_id"), **row})
    store = get_working_memory()
    sessions = Session.objects.filter(agent_id=agent_id, status=Session.Status.OPEN)
    for session in sessions.order_by("started_at").iterator(chunk_size=CHUNK):
        state = store.get(session_id=str(session.pk))
        if state is None:
            continue  # expired in the store: the sweep will mark it
        counts["sessions"] += 1
        yield _line(
            {
                "type": "session",
                "session_id": session.pk,
                "ttl_seconds": session.ttl_seconds,
                "state": state,
            }
        )
    cycles = DreamCycle.objects.filter(agent_id=agent_id).order_by("number")
    for cycle in cycles.values("id", *CYCLE_FIELDS).iterator(chunk_size=CHUNK):
        draws = DreamCycleItem.objects.filter(cycle_id=cycle.pop("id")).order_by("position")
        counts["dream_cycles"] += 1
        yield _line({"type": "dream_cycle", **cycle, "items": list(draws.values(*DRAW_FIELDS))})
    yield _line({"type": "end", "counts": counts})
