"""Every non-trivial read of sessions and their working memory."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Count, QuerySet
from django.utils import timezone

from ferrum_memory.core.exceptions import Gone, NotFound

from .models import Consolidation, Session
from .working_memory import State, get_working_memory


def session_visible(*, agent_ids: Sequence[str] | None = None) -> QuerySet[Session]:
    sessions = Session.objects.all()
    return sessions if agent_ids is None else sessions.filter(agent_id__in=agent_ids)


def session_get(*, session_id: UUID | str, agent_ids: Sequence[str] | None = None) -> Session:
    """The session, or 404 when unknown or of an agent the caller may not use."""
    session = session_visible(agent_ids=agent_ids).filter(pk=session_id).first()
    if session is None:
        raise NotFound(f"No session '{session_id}'.")
    return session


def session_gone(session: Session, *, now: datetime | None = None) -> Gone | None:
    """The 410 for a session that is closed or expired (saying when), None when it is live."""
    now = now or timezone.now()
    extra: dict[str, Any] = {
        "session_id": str(session.pk),
        "status": session.status,
        "summary_item_id": str(session.summary_item_id) if session.summary_item_id else None,
    }
    if session.status == Session.Status.CLOSED:
        assert session.closed_at is not None
        when = session.closed_at.isoformat()
        return Gone(f"Session {session.pk} was closed at {when}.", closed_at=when, **extra)
    if session.status == Session.Status.EXPIRED or session.expires_at <= now:
        when = session.expires_at.isoformat()
        extra["status"] = Session.Status.EXPIRED
        return Gone(f"Session {session.pk} expired at {when}.", expired_at=when, **extra)
    return None


def session_state_get(
    *, session_id: UUID | str, agent_ids: Sequence[str] | None = None
) -> tuple[Session, State]:
    """A live session and its working memory: 404 unknown, 410 closed or expired, 503 when the
    store is down."""
    session = session_get(session_id=session_id, agent_ids=agent_ids)
    if gone := session_gone(session):
        raise gone
    state = get_working_memory().get(session_id=str(session.pk))
    if state is None:  # the store lost it before its time (e.g. a Redis restart)
        raise Gone(
            f"Session {session.pk}'s working memory is gone (the store no longer holds it).",
            session_id=str(session.pk),
            status=Session.Status.EXPIRED,
            expired_at=timezone.now().isoformat(),
            summary_item_id=str(session.summary_item_id) if session.summary_item_id else None,
        )
    return session, state


def session_latest_consolidation(*, session: Session) -> Consolidation | None:
    return (
        Consolidation.objects.select_related("session", "summary_item")
        .filter(session=session)
        .order_by("-version")
        .first()
    )


def session_stats(agent_ids: Sequence[str] | None) -> dict[str, Any]:
    by_status = dict(
        session_visible(agent_ids=agent_ids)
        .values("status")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("status", "n")
    )
    consolidations = Consolidation.objects.filter(session__in=session_visible(agent_ids=agent_ids))
    return {
        "count": sum(by_status.values()),
        "count_by_status": by_status,
        "consolidations": consolidations.count(),
        "consolidations_pending": consolidations.exclude(status=Consolidation.Status.DONE).count(),
        "working_memory": get_working_memory().engine,
    }
