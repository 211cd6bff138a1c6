"""Writes that span every app for one agent."""

import logging
from dataclasses import dataclass

from django.db import OperationalError, connection
from django.utils import timezone

from experience.replay_index import get_replay_index
from experience.services import experience_erase_agent
from memory.services import memory_erase_agent, memory_index_now
from sessions.services import session_erase_agent

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
    trees) drop them, and this process's indexes do so before this returns.

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
