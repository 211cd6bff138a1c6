"""Writes that span every app for one agent."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db import OperationalError, connection, transaction
from django.db.models import Model
from django.utils import timezone
from rest_framework.serializers import Serializer

from experience.models import REVISION as EXPERIENCE_REVISION
from experience.models import DreamCycle, DreamCycleItem, Experience
from experience.replay_index import get_replay_index
from experience.serializers import ExperienceInSerializer
from experience.services import experience_erase_agent
from ferrum_memory.core.exceptions import Conflict, ServiceError
from ferrum_memory.core.revisions import revision_take
from memory.embeddings import get_embedder
from memory.models import REVISION as MEMORY_REVISION
from memory.models import MemoryEvent, MemoryItem
from memory.services import (
    content_hash,
    memory_check_model,
    memory_count_word_pieces,
    memory_erase_agent,
    memory_index_now,
)
from sessions.models import Session
from sessions.serializers import SessionStartSerializer
from sessions.services import SET_FIELDS, session_erase_agent, session_start

from . import serializers as s
from .models import AgentErasure

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Erasure:
    record: AgentErasure
    erased_now: bool  # False: nothing was left, `record` is the agent's last erasure


def agent_erase(*, agent_id: str, actor: str = "") -> Erasure:
    """Erase everything the service holds for `agent_id`: memory items and their history,
    sessions with their working memory and consolidations, experiences, dream cycles and
    their draws; tombstones make every derived index (each process's vector index and replay
    trees) drop them, and this process's indexes do so before this returns, as do the word
    pieces' counts, counted again from what remains (12 s at 10^5 items: memory.apps).

    Each part is deleted in chunks, so it is complete in one call whatever the count, and a
    call cut short (a lost connection) is finished by the next. What remains is an
    AgentErasure: agent, time, actor, counts. A call that finds nothing left answers the
    agent's last erasure record (idempotent)."""
    counts = (
        session_erase_agent(agent_id=agent_id)
        | memory_erase_agent(agent_id=agent_id)
        | experience_erase_agent(agent_id=agent_id)
    )
    memory_index_now()
    memory_count_word_pieces()
    get_replay_index().catch_up()
    _checkpoint()
    if not any(counts.values()):
        last = AgentErasure.objects.filter(agent_id=agent_id).first()
        if last is not None:
            return Erasure(last, erased_now=False)
    record = AgentErasure.objects.create(
        agent_id=agent_id, erased_at=timezone.now(), actor=actor, counts=counts
    )
    return Erasure(record, erased_now=True)


def _checkpoint() -> None:
    """On SQLite, copy the write-ahead log into the database file and empty it: with
    secure_delete on (settings), the freed pages are zeros there, and the log no longer holds
    the pages as they were. A reader in another process can keep part of the log alive until
    the next checkpoint; SQLite then says so, and the next write's checkpoint finishes it."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return  # (a checkpoint cannot run inside a transaction: only tests call it so)
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            busy, _, _ = cursor.fetchone()
    except OperationalError as exc:  # another connection's write lock
        busy, reason = 1, str(exc)
    else:
        reason = "a reader holds the log"
    if busy:
        logger.warning(
            "WAL checkpoint after an erasure did not finish (%s): SQLite's next "
            "checkpoints copy it, and new writes overwrite the log",
            reason,
        )


# Import -------------------------------------------------------------------------------------

KINDS = ("memory_items", "memory_events", "experiences", "sessions", "dream_cycles")
LINE_KIND = {
    "memory": "memory_items",
    "memory_event": "memory_events",
    "experience": "experiences",
    "session": "sessions",
    "dream_cycle": "dream_cycles",
}
EXPERIENCE_API_FIELDS = (
    "id",
    "session_id",
    "task",
    "tool_calls",
    "test_result",
    "reward",
    "td_error",
    "metadata",
)
SESSION_STATE_FIELDS = (*SET_FIELDS, "messages")
WRITE_BATCH = 1_000


class ImportRefused(ServiceError):
    """A line of the file is not what an export writes: nothing is imported."""

    def __init__(self, line: int, message: str, errors: Any = None) -> None:
        super().__init__(f"Line {line}: {message} Nothing was imported.", line=line)
        if errors is not None:
            self.extra["errors"] = errors


class ImportConflict(Conflict):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"Line {line}: {message} Nothing was imported.", line=line)


@dataclass
class _Parsed:
    header: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, list[tuple[int, dict[str, Any]]]] = field(
        default_factory=lambda: {kind: [] for kind in KINDS}
    )


def _valid(serializer_class: type[Serializer], data: Any, line: int) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise ImportRefused(line, "invalid fields.", serializer.errors)
    return dict(serializer.validated_data)


def _experience(record: dict[str, Any], agent_id: str, line: int) -> dict[str, Any]:
    api = {name: record.pop(name) for name in EXPERIENCE_API_FIELDS if name in record}
    if "id" not in api:
        raise ImportRefused(line, "an experience needs its id.", {"id": ["Required."]})
    item = _valid(ExperienceInSerializer, {**api, "agent_id": agent_id}, line)
    item |= _valid(s.ExperienceExtraLineSerializer, record, line)
    item["experience_id"] = item.pop("id")
    return item


def _session(record: dict[str, Any], agent_id: str, line: int) -> dict[str, Any]:
    session = _valid(s.SessionLineSerializer, record, line)
    state = {k: v for k, v in session.pop("state").items() if k in SESSION_STATE_FIELDS}
    fields = _valid(SessionStartSerializer, {**state, "agent_id": agent_id}, line)
    fields.pop("agent_id")
    return session | {"messages": fields.pop("messages", []), "fields": fields}


def _parse(lines: Iterable[bytes], agent_id: str) -> _Parsed:
    parsed = _Parsed()
    validate: dict[str, Any] = {
        "memory": lambda record, n: _valid(s.MemoryLineSerializer, record, n),
        "memory_event": lambda record, n: _valid(s.MemoryEventLineSerializer, record, n),
        "experience": lambda record, n: _experience(record, agent_id, n),
        "session": lambda record, n: _session(record, agent_id, n),
        "dream_cycle": lambda record, n: _valid(s.DreamCycleLineSerializer, record, n),
    }
    end: dict[str, Any] | None = None
    number = 0
    for number, raw in enumerate(lines, 1):
        if end is not None:
            raise ImportRefused(number, "a line after the end line.")
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ImportRefused(number, "not JSON (a truncated or corrupt file?).") from None
        if not isinstance(record, dict):
            raise ImportRefused(number, "not a JSON object.")
        kind = record.pop("type", None)
        if number == 1:
            if kind != "header":
                raise ImportRefused(1, "the first line must be the export's header.")
            parsed.header = _valid(s.HeaderLineSerializer, record, 1)
        elif kind == "end":
            end = record
        elif kind in validate:
            parsed.lines[LINE_KIND[kind]].append((number, validate[kind](record, number)))
        else:
            raise ImportRefused(number, f"unknown line type {kind!r}.")
    if number == 0:
        raise ImportRefused(1, "the file is empty.")
    if end is None:
        raise ImportRefused(number + 1, "the file ends before its end line (truncated?).")
    held = {kind: len(parsed.lines[kind]) for kind in KINDS}
    if end.get("counts") != held:
        raise ImportRefused(number, f"the end line counts {end.get('counts')}, the file {held}.")
    return parsed


@dataclass(frozen=True)
class ImportResult:
    agent_id: str
    imported: dict[str, int]
    skipped: dict[str, int]
    reembedded: int


def agent_import(*, agent_id: str, lines: Iterable[bytes]) -> ImportResult:
    """Import an export (agent_export's lines) as `agent_id`, all or nothing.

    Every line is read and checked first: a corrupt or truncated file imports nothing, and
    the error names the line. Ids that belong to another agent are refused (409); rows the
    agent already has (same id) are kept as they are and counted as skipped. Memory items
    made by another embedding model than the configured one are embedded again."""
    parsed = _parse(lines, agent_id)
    memory_check_model()
    embedder = get_embedder()
    memories = parsed.lines["memory_items"]
    stale = [
        item
        for _, item in memories
        if item["embedding_model"] != embedder.model_name
        or len(item["embedding"]) != embedder.dim * 4
    ]
    # And those whose sentence or token vectors are of another size, or absent (an export
    # made before items kept them; a model that gives no token states has none to give).
    stale_ids = {id(item) for item in stale}
    unembedded = [
        item
        for _, item in memories
        if id(item) in stale_ids
        or len(item.get("sentence_embeddings", b"x")) % (embedder.dim * 4)
        or len(item.get("token_embeddings", b"")) % embedder.dim
        or (not item.get("token_embeddings") and embedder.gives_token_states)
    ]
    for start in range(0, len(unembedded), WRITE_BATCH):
        batch = unembedded[start : start + WRITE_BATCH]
        embedded = embedder.embed_items([item["content"] for item in batch])
        for item, vector, sentence_blob, token_blob in zip(
            batch, embedded.vectors, embedded.sentences, embedded.tokens, strict=True
        ):
            if id(item) in stale_ids:
                item["embedding"] = vector.astype("<f4").tobytes()
            item["sentence_embeddings"] = sentence_blob
            item["token_embeddings"] = token_blob
    imported = dict.fromkeys(KINDS, 0)
    skipped = dict.fromkeys(KINDS, 0)
    with transaction.atomic():
        _import_memories(agent_id, parsed, embedder.model_name, imported, skipped)
        pks = _import_experiences(agent_id, parsed, imported, skipped)
        _import_cycles(agent_id, parsed, pks, imported, skipped)
        _import_sessions(agent_id, parsed, imported, skipped)
    memory_index_now()
    memory_count_word_pieces()  # its items weigh in the IDF at once, as an erasure's leave it
    get_replay_index().catch_up()
    return ImportResult(agent_id, imported, skipped, len(stale))


def _owned(model: type[Model], field: str, ids: list[Any]) -> dict[Any, str]:
    """{id: agent_id} of the rows among `ids` that exist (in chunks: SQLite caps parameters)."""
    owners: dict[Any, str] = {}
    for start in range(0, len(ids), WRITE_BATCH):
        chunk = ids[start : start + WRITE_BATCH]
        lookup = {f"{field}__in": chunk}
        owners |= dict(model._default_manager.filter(**lookup).values_list(field, "agent_id"))
    return owners


def _refuse_foreign(
    owners: dict[Any, str], lines: list[tuple[int, Any]], agent_id: str, noun: str
) -> set[Any]:
    """The ids the agent has already; ImportConflict at the first that another agent has."""
    for number, key in lines:
        if owners.get(key, agent_id) != agent_id:
            raise ImportConflict(number, f"{noun} '{key}' belongs to another agent.")
    return set(owners)


def _import_memories(
    agent_id: str,
    parsed: _Parsed,
    model: str,
    imported: dict[str, int],
    skipped: dict[str, int],
) -> None:
    memories = parsed.lines["memory_items"]
    events = parsed.lines["memory_events"]
    keyed = [(n, item["id"]) for n, item in memories] + [(n, e["point_id"]) for n, e in events]
    owners = _owned(MemoryItem, "id", list({key for _, key in keyed}))
    have = _refuse_foreign(owners, keyed, agent_id, "Memory item")
    revision = revision_take(name=MEMORY_REVISION)
    rows = [
        MemoryItem(
            **{k: v for k, v in item.items() if k not in {"embedding_model"}},
            agent_id=agent_id,
            content_hash=content_hash(item["content"]),
            embedding_model=model,
            revision=revision,
        )
        for _, item in memories
        if item["id"] not in have
    ]
    MemoryItem.objects.bulk_create(rows, batch_size=WRITE_BATCH)
    new = {row.pk for row in rows}
    MemoryEvent.objects.bulk_create(
        (
            MemoryEvent(**event, agent_id=agent_id)
            for _, event in events
            if event["point_id"] in new
        ),
        batch_size=WRITE_BATCH,
    )
    imported["memory_items"], skipped["memory_items"] = len(rows), len(memories) - len(rows)
    imported["memory_events"] = sum(1 for _, event in events if event["point_id"] in new)
    skipped["memory_events"] = len(events) - imported["memory_events"]


def _import_experiences(
    agent_id: str, parsed: _Parsed, imported: dict[str, int], skipped: dict[str, int]
) -> dict[str, int]:
    """Writes the experiences; answers {experience_id: pk} of every one of the file."""
    lines = parsed.lines["experiences"]
    keyed = [(n, item["experience_id"]) for n, item in lines]
    owners = _owned(Experience, "experience_id", [key for _, key in keyed])
    have = _refuse_foreign(owners, keyed, agent_id, "Experience")
    revision = revision_take(name=EXPERIENCE_REVISION)
    rows = []
    for _, item in lines:
        if item["experience_id"] in have:
            continue
        test_result = item.get("test_result")
        rows.append(
            Experience(
                **{k: v for k, v in item.items() if k not in {"ttl_seconds", "agent_id"}},
                agent_id=agent_id,
                passed=None if test_result is None else test_result["passed"],
                revision=revision,
            )
        )
    Experience.objects.bulk_create(rows, batch_size=WRITE_BATCH)
    imported["experiences"], skipped["experiences"] = len(rows), len(lines) - len(rows)
    ids = [key for _, key in keyed]
    pks: dict[str, int] = {}
    for start in range(0, len(ids), WRITE_BATCH):
        chunk = Experience.objects.filter(experience_id__in=ids[start : start + WRITE_BATCH])
        pks |= dict(chunk.values_list("experience_id", "id"))
    return pks


def _import_cycles(
    agent_id: str,
    parsed: _Parsed,
    pks: dict[str, int],
    imported: dict[str, int],
    skipped: dict[str, int],
) -> None:
    """Dream cycles with their draws. A cycle claimed when exported comes back pending: its
    lease token is not exported, so its learner could not report it anyway."""
    have = set(DreamCycle.objects.filter(agent_id=agent_id).values_list("number", flat=True))
    for _, cycle in parsed.lines["dream_cycles"]:
        if cycle["number"] in have:
            skipped["dream_cycles"] += 1
            continue
        draws = cycle.pop("items")
        if cycle["status"] == DreamCycle.Status.CLAIMED:
            cycle["status"] = DreamCycle.Status.PENDING
        row = DreamCycle.objects.create(**cycle, agent_id=agent_id)
        DreamCycleItem.objects.bulk_create(
            DreamCycleItem(cycle=row, experience_pk=pks.get(draw["experience_id"], 0), **draw)
            for draw in draws
        )
        imported["dream_cycles"] += 1


def _import_sessions(
    agent_id: str, parsed: _Parsed, imported: dict[str, int], skipped: dict[str, int]
) -> None:
    """Open sessions, started again (version 1) with their working memory as exported. Last,
    so that the working-memory store (not in this transaction) is written only once every
    other row is."""
    lines = parsed.lines["sessions"]
    keyed = [(n, session["session_id"]) for n, session in lines]
    owners = _owned(Session, "id", [key for _, key in keyed])
    have = _refuse_foreign(owners, keyed, agent_id, "Session")
    for _, session in lines:
        if session["session_id"] in have:
            skipped["sessions"] += 1
            continue
        session_start(
            agent_id=agent_id,
            fields=session["fields"],
            messages=session["messages"],
            ttl_seconds=session["ttl_seconds"],
            session_id=session["session_id"],
        )
        imported["sessions"] += 1
