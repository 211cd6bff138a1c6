"""Every write of sessions: start, update, close, compress, consolidate, and the idle sweep.

Working memory lives in the store (sessions.working_memory); the Session row is the durable
record. Consolidation is exactly once per (session, version): a unique Consolidation row holds
a snapshot of that state, a worker claims it with a conditional UPDATE (a lease, so a worker
killed mid-task is taken over when the lease ends) and finishes it with another one.
"""

import logging
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from ferrum_memory.core.exceptions import Conflict, Gone, NotFound, ServiceError
from ferrum_memory.core.revisions import delete_all
from memory.embeddings import get_embedder
from memory.models import MemoryItem
from memory.services import memory_delete_many, memory_store_many

from .consolidation import extract, memory_items
from .models import Consolidation, Session, WorkingMemoryEntry
from .selectors import session_gone, session_state_get
from .working_memory import State, VersionConflict, WorkingMemoryUnavailable, get_working_memory

logger = logging.getLogger(__name__)

SET_FIELDS = ("task", "scratchpad", "facts", "tool_state", "step", "outcome", "metadata")
SWEEP_BATCH = 500
# A consolidation asked for this long ago and not done is sent to the worker again.
STALE_PENDING_SECONDS = 120


class StateTooLarge(ServiceError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message, **{field_name: [message]})


class ConsolidationBusy(Exception):
    """Another run holds the claim; retry after `retry_in` seconds (its lease)."""

    def __init__(self, retry_in: float) -> None:
        super().__init__(f"claimed by another run for {retry_in:.0f}s more")
        self.retry_in = retry_in


def _times(session: Session, now: datetime) -> dict[str, datetime]:
    ttl = session.ttl_seconds
    return {
        "last_activity_at": now,
        "expires_at": now + timedelta(seconds=ttl),
        "consolidate_after": now + timedelta(seconds=ttl * settings.SESSION_IDLE_FRACTION),
    }


def _check_size(state: State, blame: str) -> None:
    messages = len(state["messages"])
    if messages > settings.SESSION_MAX_MESSAGES:
        raise StateTooLarge(
            "messages" if blame != "append_messages" else blame,
            f"Working memory would hold {messages} messages; at most "
            f"{settings.SESSION_MAX_MESSAGES}.",
        )
    size = len(orjson.dumps(state))
    if size > settings.SESSION_MAX_STATE_BYTES:
        raise StateTooLarge(
            blame,
            f"Working memory would be {size} bytes of JSON; at most "
            f"{settings.SESSION_MAX_STATE_BYTES} (SESSION_MAX_STATE_BYTES).",
        )


def _largest(fields: dict[str, Any]) -> str:
    return max(fields, key=lambda name: len(orjson.dumps(fields[name])), default="state")


def session_start(
    *,
    agent_id: str,
    fields: dict[str, Any],
    messages: Sequence[dict[str, Any]] = (),
    ttl_seconds: int | None = None,
    now: datetime | None = None,
    session_id: UUID | None = None,
) -> tuple[Session, State]:
    """Open a session and write its first state (version 1) to the working-memory store.
    `session_id` is for an import, which keeps the id the session had."""
    now = now or timezone.now()
    session = Session(
        id=session_id or uuid.uuid4(),
        agent_id=agent_id,
        ttl_seconds=ttl_seconds or settings.DEFAULT_WORKING_MEM_TTL,
        started_at=now,
        version=1,
    )
    for name, value in _times(session, now).items():
        setattr(session, name, value)
    state: State = {
        "session_id": str(session.pk),
        "agent_id": agent_id,
        "task": "",
        "messages": list(messages),
        "scratchpad": "",
        "facts": [],
        "tool_state": {},
        "step": 0,
        "outcome": "",
        "metadata": {},
        **{name: fields[name] for name in SET_FIELDS if name in fields},
        "version": 1,
        "created_at": now.isoformat(),
        "updated_at": now.isoformat(),
        "expires_at": session.expires_at.isoformat(),
    }
    _check_size(state, "messages" if messages else _largest(fields))
    # The store first: when it is down nothing is written and the caller gets 503.
    get_working_memory().create(session_id=str(session.pk), state=state, ttl=session.ttl_seconds)
    session.save(force_insert=True)
    return session, state


def session_update(
    *,
    session_id: UUID | str,
    version: int,
    fields: dict[str, Any],
    append_messages: Sequence[dict[str, Any]] = (),
    agent_ids: Sequence[str] | None = None,
    now: datetime | None = None,
) -> State:
    """Set fields and append messages, if `version` is the current one (409 otherwise, with the
    current version). Every update takes the next version and refreshes the TTL."""
    now = now or timezone.now()
    session, state = session_state_get(session_id=session_id, agent_ids=agent_ids)
    current = int(state["version"])
    if version != current:
        raise Conflict(
            f"Stale version {version}: the session is at version {current}.",
            current_version=current,
        )
    new_state = {
        **state,
        **{name: fields[name] for name in SET_FIELDS if name in fields},
        "messages": [*state["messages"], *append_messages],
        "version": current + 1,
        "updated_at": now.isoformat(),
        "expires_at": (now + timedelta(seconds=session.ttl_seconds)).isoformat(),
    }
    _check_size(new_state, "append_messages" if append_messages else _largest(fields))
    # One commit for the state and the session's row when the working memory is the database:
    # a process killed between the two left the row a version behind an acknowledged state
    # (tests/faults/test_crash.py). With Redis the close brings the row up to date.
    with transaction.atomic():
        try:
            get_working_memory().replace(
                session_id=str(session.pk),
                expected_version=current,
                state=new_state,
                ttl=session.ttl_seconds,
            )
        except VersionConflict as lost:
            if lost.current is None:
                raise Gone(f"Session {session.pk}'s working memory is gone.") from lost
            raise Conflict(
                f"Stale version {version}: the session is at version {lost.current}.",
                current_version=lost.current,
            ) from lost
        moved = Session.objects.filter(pk=session.pk, status=Session.Status.OPEN).update(
            version=current + 1, **_times(session, now)
        )
        if not moved:  # closed while this update was on its way: it is not part of the session
            session.refresh_from_db()
            raise session_gone(session) or Gone(f"Session {session.pk} is no longer open.")
    return new_state


# Consolidation -------------------------------------------------------------------------------


def _enqueue(consolidation: Consolidation) -> None:
    """Hand it to the worker; with the broker down the idle sweep sends it later."""
    from .tasks import consolidate_session

    try:
        consolidate_session.apply_async(args=[consolidation.pk], task_id=consolidation.task_id)
    except BrokerError as exc:
        logger.warning("consolidation %s not sent, the sweep will: %s", consolidation.pk, exc)


def _consolidation_for(
    *, session: Session, state: State, reason: str, now: datetime
) -> tuple[Consolidation, bool]:
    """The Consolidation of this state, created (with a snapshot of the state) if new."""
    return Consolidation.objects.get_or_create(
        session=session,
        version=int(state["version"]),
        defaults={
            "reason": reason,
            "task_id": uuid.uuid4().hex,
            "state": state,
            "created_at": now,
        },
    )


def session_close(
    *, session_id: UUID | str, agent_ids: Sequence[str] | None = None, now: datetime | None = None
) -> Consolidation:
    """Close a session and have the worker consolidate its last state. Closing a closed
    session answers the same consolidation (sent again if it is not done)."""
    now = now or timezone.now()
    with transaction.atomic():
        session = (
            Session.objects.select_for_update()
            .filter(pk=session_id, **({"agent_id__in": agent_ids} if agent_ids is not None else {}))
            .first()
        )
        if session is None:
            raise NotFound(f"No session '{session_id}'.")
        if session.status == Session.Status.CLOSED:
            consolidation = Consolidation.objects.filter(session=session).order_by("-version")[0]
            if consolidation.status != Consolidation.Status.DONE:
                transaction.on_commit(lambda: _enqueue(consolidation))
            return consolidation
        if gone := session_gone(session, now=now):
            raise gone
        store = get_working_memory()
        state = store.get(session_id=str(session.pk))
        if state is None:
            raise Gone(f"Session {session.pk}'s working memory is gone.")
        consolidation, _ = _consolidation_for(session=session, state=state, reason="close", now=now)
        session.status = Session.Status.CLOSED
        session.closed_at = now
        session.version = consolidation.version  # the state's, closed as it is
        session.save(update_fields=["status", "closed_at", "version"])
        if consolidation.status != Consolidation.Status.DONE:
            transaction.on_commit(lambda: _enqueue(consolidation))
        transaction.on_commit(lambda: _forget(str(session.pk)))
    return consolidation


def _forget(session_id: str) -> None:
    try:
        get_working_memory().delete(session_id=session_id)
    except WorkingMemoryUnavailable:
        pass  # its TTL ends it


def session_compress(
    *, session_id: UUID | str, agent_ids: Sequence[str] | None = None, now: datetime | None = None
) -> tuple[Consolidation, bool]:
    """Consolidate the session's current state now, without closing it. Returns the
    consolidation and whether it is new; the same state again creates nothing new."""
    now = now or timezone.now()
    session, state = session_state_get(session_id=session_id, agent_ids=agent_ids)
    consolidation, created = _consolidation_for(
        session=session, state=state, reason="compress", now=now
    )
    if consolidation.status != Consolidation.Status.DONE:
        try:
            consolidation = session_consolidation_run(consolidation_id=consolidation.pk, now=now)
        except ConsolidationBusy:
            consolidation.refresh_from_db()
    return consolidation, created


def session_consolidation_run(
    *, consolidation_id: int, now: datetime | None = None
) -> Consolidation:
    """Run one consolidation, once: claim it (a conditional UPDATE), extract, store the items
    through memory_store_many (deduplicated against the agent's memory), finish it (another
    conditional UPDATE). Done: nothing happens. Claimed by a live run: ConsolidationBusy.

    A run that dies after storing and before finishing is redone when its lease ends; its
    items are then exact duplicates, merged by memory_store_many, so no item is stored twice."""
    now = now or timezone.now()
    token = secrets.token_hex(16)
    free = Q(status=Consolidation.Status.PENDING) | Q(
        status=Consolidation.Status.RUNNING, lease_until__lte=now
    )
    won = Consolidation.objects.filter(free, pk=consolidation_id).update(
        status=Consolidation.Status.RUNNING,
        claim_token=token,
        lease_until=now + timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT),
        attempts=F("attempts") + 1,
    )
    consolidation = (
        Consolidation.objects.select_related("session", "summary_item")
        .filter(pk=consolidation_id)
        .first()
    )
    if consolidation is None:
        raise NotFound(f"No consolidation {consolidation_id}.")
    if not won:
        if consolidation.status == Consolidation.Status.RUNNING:
            assert consolidation.lease_until is not None
            raise ConsolidationBusy((consolidation.lease_until - now).total_seconds())
        return consolidation
    finished = False
    try:
        _consolidate(consolidation, token, now)
        finished = True
    finally:
        if not finished:  # an error: let the next delivery (or the sweep) try again
            Consolidation.objects.filter(pk=consolidation_id, claim_token=token).update(
                status=Consolidation.Status.PENDING, claim_token="", lease_until=None
            )
    consolidation.refresh_from_db()
    return consolidation


def _consolidate(consolidation: Consolidation, token: str, now: datetime) -> None:
    session = consolidation.session
    state = consolidation.state or {}
    extraction = extract(state, embedder=get_embedder())
    items = memory_items(
        extraction,
        agent_id=session.agent_id,
        session_id=str(session.pk),
        version=consolidation.version,
    )
    newer = Session.objects.filter(pk=session.pk, consolidated_version__lt=consolidation.version)
    replaced = newer.values_list("summary_item_id", flat=True).first()
    if replaced and extraction.summary:
        # The newest summary covers the whole session, so the earlier one goes; first, or the
        # new one would be merged into it as a near duplicate and the new turns lost.
        memory_delete_many(
            queryset=MemoryItem.objects.filter(
                pk=replaced, kind=MemoryItem.Kind.SESSION_SUMMARY, session_id=str(session.pk)
            )
        )
    stored = memory_store_many(items=items, now=now) if items else []
    ids = list(dict.fromkeys(str(result.item.id) for result in stored))
    summary = stored[0].item if extraction.summary and stored else None
    with transaction.atomic():
        done = Consolidation.objects.filter(
            pk=consolidation.pk, claim_token=token, status=Consolidation.Status.RUNNING
        ).update(
            status=Consolidation.Status.DONE,
            state=None,
            summary_item=summary,
            memory_item_ids=ids,
            finished_at=timezone.now(),
        )
        if done:  # else taken over after the lease ended: the other run finishes it
            update: dict[str, Any] = {"consolidated_version": consolidation.version}
            if summary is not None:
                update["summary_item"] = summary
            newer.update(**update)


# The idle sweep (beat) -----------------------------------------------------------------------


ERASE_CHUNK = 1_000


def session_erase_agent(*, agent_id: str) -> dict[str, int]:
    """Delete every session of the agent: its working memory first (Redis or the database),
    then its consolidations (with their state snapshots) and its rows. With Redis down this
    fails before any row goes, so a retry still finds every session whose key it must delete.
    """
    store = get_working_memory()
    sessions = Session.objects.filter(agent_id=agent_id)
    for session_id in sessions.values_list("pk", flat=True).iterator(chunk_size=ERASE_CHUNK):
        store.delete(session_id=str(session_id))
    delete_all(WorkingMemoryEntry.objects.filter(agent_id=agent_id), chunk=ERASE_CHUNK)
    consolidations = delete_all(
        Consolidation.objects.filter(session__agent_id=agent_id), chunk=ERASE_CHUNK
    )
    return {"sessions": delete_all(sessions, chunk=ERASE_CHUNK), "consolidations": consolidations}


@dataclass
class SweepReport:
    consolidations: list[int] = field(default_factory=list)
    expired: int = 0
    resent: int = 0
    purged: int = 0
    store_down: bool = False


def session_sweep(*, now: datetime | None = None) -> SweepReport:
    """The beat job. Safe to overlap with itself: each step is idempotent.

    1. Sessions idle for SESSION_IDLE_FRACTION of their TTL, with a version not consolidated
       yet: snapshot the state and send it to the worker, before the store forgets it.
    2. Open sessions past their TTL become expired; the database store drops their states.
    3. Consolidations not done long after they were asked for (a lost message, a dead run
       whose lease ended) are sent again."""
    now = now or timezone.now()
    report = SweepReport()
    store = get_working_memory()
    idle = Session.objects.filter(
        status=Session.Status.OPEN,
        consolidate_after__lte=now,
        consolidated_version__lt=F("version"),
    ).order_by("consolidate_after")[:SWEEP_BATCH]
    for session in idle:
        try:
            state = store.get(session_id=str(session.pk), include_expired=True)
        except WorkingMemoryUnavailable:
            report.store_down = True
            break
        if state is None:
            logger.warning("session %s: its working memory was gone before the sweep", session.pk)
            continue
        with transaction.atomic():
            consolidation, created = _consolidation_for(
                session=session, state=state, reason="idle", now=now
            )
            if created:
                report.consolidations.append(consolidation.pk)
                transaction.on_commit(lambda c=consolidation: _enqueue(c))  # type: ignore[misc]
    if not report.store_down:
        report.expired = Session.objects.filter(
            status=Session.Status.OPEN, expires_at__lte=now
        ).update(status=Session.Status.EXPIRED)
        report.purged = store.purge_expired(now=now)
    horizon = now - timedelta(seconds=STALE_PENDING_SECONDS)
    stale = Consolidation.objects.filter(
        Q(status=Consolidation.Status.PENDING, created_at__lte=horizon)
        | Q(status=Consolidation.Status.RUNNING, lease_until__lte=now)
    ).exclude(pk__in=report.consolidations)[:SWEEP_BATCH]
    for consolidation in stale:
        _enqueue(consolidation)
        report.resent += 1
    return report
