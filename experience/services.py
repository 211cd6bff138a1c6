"""Every write to the replay buffer. Each write transaction takes one "experience" revision,
so every process's replay index sees the change on its next request."""

import atexit
import logging
import math
import operator
import os
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, JSONField, Max, QuerySet
from django.utils import timezone
from kombu.exceptions import OperationalError

from ferrum_memory.core.exceptions import Conflict
from ferrum_memory.core.renderers import json_bytes
from ferrum_memory.core.revisions import (
    Doomed,
    delete_all,
    revision_delete,
    revision_delete_all,
    revision_purge_expired,
    revision_take,
    rows_locked,
)

from .models import (
    REVISION,
    DreamCycle,
    DreamCycleItem,
    Experience,
    ExperienceTombstone,
    ReplaySettings,
    ReplaySnapshot,
    ReplayState,
)
from .replay_selectors import replay_controls_many
from .selectors import experience_in_bulk_by_id

# New items with no TD error get the buffer's max priority; an empty buffer starts here.
INITIAL_MAX_PRIORITY = 1.0
PURGE_CHUNK = 5_000

logger = logging.getLogger(__name__)


def priority_from_td_error(td_error: float) -> float:
    """p_i = (|delta_i| + eps) ** alpha under the configured alpha."""
    return (abs(td_error) + settings.REPLAY_EPSILON) ** settings.REPLAY_ALPHA


def _agent_max_priorities(agent_ids: Iterable[str]) -> dict[str, float]:
    """{agent_id: its max priority} for agents that have experiences.

    One query per agent: each reads one entry of the (agent_id, priority) index, where a single
    GROUP BY over the agents scanned all their index entries (1.6 s at 10^6 rows)."""
    tops = {
        agent: Experience.objects.filter(agent_id=agent).aggregate(top=Max("priority"))["top"]
        for agent in set(agent_ids)
    }
    return {agent: top for agent, top in tops.items() if top is not None}


@dataclass(frozen=True)
class StoredExperience:
    experience: Experience
    created: bool


@transaction.atomic
def experience_create_many(
    *, items: Sequence[dict[str, Any]], now: datetime | None = None
) -> list[StoredExperience]:
    """Store validated experience dicts, each with its experience_id (client's or made up);
    an item whose experience_id exists, or came earlier in `items`, is returned as stored.

    All or nothing: an id already used by another agent fails the whole call with 409.
    """
    now = now or timezone.now()
    # The rows are built before the revision is taken: from there on, the counter's row lock
    # makes every other experience write wait for this transaction's commit.
    rows: dict[str, Experience] = {}
    for item in items:  # an id sent twice is one experience sent again: the first is stored
        if item["experience_id"] not in rows:
            rows[item["experience_id"]] = _new_row(item, now)
    revision = revision_take(name=REVISION)
    # Read after the lock: a concurrent POST of the same new id has committed by now, so its
    # row is found here instead of failing this insert on the unique constraint.
    existing = experience_in_bulk_by_id(list(rows))
    for item in items:
        stored = existing.get(item["experience_id"]) or rows[item["experience_id"]]
        if stored.agent_id != item["agent_id"]:
            raise Conflict(
                f"Experience id '{stored.experience_id}' is already used by another agent.",
                experience_id=stored.experience_id,
            )
    new_rows = [row for eid, row in rows.items() if eid not in existing]
    max_priority = _agent_max_priorities(row.agent_id for row in new_rows if row.priority is None)
    for row in new_rows:
        row.revision = revision
        if row.priority is None:
            row.priority = max_priority.get(row.agent_id) or INITIAL_MAX_PRIORITY
    _insert(new_rows)
    _count_inserts_and_evict(new_rows)
    results, created = [], set()
    for eid in (item["experience_id"] for item in items):
        if eid in existing:
            results.append(StoredExperience(existing[eid], False))
        else:
            results.append(StoredExperience(rows[eid], eid not in created))
            created.add(eid)
    return results


def _insert(rows: list[Experience]) -> None:
    """Experience.objects.bulk_create(rows), by COPY on PostgreSQL: there bulk_create spent
    200 ms of each 1,000 rows in psycopg's pure-Python array dumper, escaping the JSON columns
    into array literals (Django 5.2 inserts through UNNEST of arrays)."""
    db = transaction.get_connection()
    if db.vendor != "postgresql" or len(rows) < 2:
        Experience.objects.bulk_create(rows)
        return
    meta = Experience._meta
    fields = meta.concrete_fields
    # The values as they are (str, float, bool, datetime: psycopg adapts each), JSON as text
    # by orjson: Django's get_db_prep_save per value was 40 ms of 1,000 rows.
    values_of = operator.attrgetter(*(field.attname for field in fields))
    json_at = [i for i, field in enumerate(fields) if isinstance(field, JSONField)]

    columns = ", ".join(db.ops.quote_name(field.column) for field in fields)
    with db.cursor() as cursor:
        # The ids first, from the table's own sequence, as bulk_create's RETURNING gives them.
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, len(rows)],
        )
        for row, (pk,) in zip(rows, cursor.fetchall(), strict=True):
            row.pk = pk
        table = db.ops.quote_name(meta.db_table)
        # Django wraps execute()'s errors, not COPY's: an IntegrityError stays an IntegrityError.
        with db.wrap_database_errors, cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                values = list(values_of(row))
                for i in json_at:
                    if values[i] is not None:
                        values[i] = json_bytes(values[i]).decode()
                copy.write_row(values)
    for row in rows:
        row._state.adding = False
        row._state.db = db.alias


def _new_row(item: dict[str, Any], now: datetime) -> Experience:
    """The row for a validated item; with no TD error its priority is left None, for the
    agent's max priority, and its revision is set once taken."""
    td_error = item.get("td_error")
    ttl = item.get("ttl_seconds", settings.DEFAULT_REPLAY_TTL)
    test_result = item.get("test_result")
    return Experience(
        experience_id=item["experience_id"],
        agent_id=item["agent_id"],
        session_id=item.get("session_id") or "",
        task=item["task"],
        tool_calls=item.get("tool_calls", []),
        test_result=test_result,
        passed=None if test_result is None else test_result["passed"],
        reward=item["reward"],
        td_error=td_error,
        priority=None if td_error is None else priority_from_td_error(td_error),  # type: ignore[misc]
        metadata=item.get("metadata", {}),
        created_at=now,
        expires_at=now + timedelta(seconds=ttl) if ttl else None,
    )


@dataclass(frozen=True)
class TdErrorUpdateResult:
    updated: int
    unknown_ids: list[str]


@transaction.atomic
def experience_td_error_update(
    *, updates: Sequence[tuple[str, float]], agent_ids: Sequence[str] | None = None
) -> TdErrorUpdateResult:
    """Set TD errors and the priorities they imply. Ids that do not exist, or that belong to an
    agent outside `agent_ids`, are reported back as unknown and nothing is written for them."""
    latest = dict(updates)  # a later update of the same id wins
    revision = revision_take(name=REVISION)
    if connection.vendor == "postgresql":
        found = _set_td_errors_in_key_order(latest, agent_ids, revision)
    else:  # SQLite: one writer at a time holds the database, so no lock order to keep
        visible = Experience.objects.filter(experience_id__in=latest)
        if agent_ids is not None:
            visible = visible.filter(agent_id__in=agent_ids)
        pks = dict(visible.values_list("experience_id", "id"))
        rows = [
            Experience(
                id=pk,
                td_error=latest[eid],
                priority=priority_from_td_error(latest[eid]),
                revision=revision,
            )
            for eid, pk in pks.items()
        ]
        Experience.objects.bulk_update(rows, ["td_error", "priority", "revision"], batch_size=1000)
        found = set(pks)
    unknown = [eid for eid in latest if eid not in found]
    return TdErrorUpdateResult(updated=len(found), unknown_ids=unknown)


def _set_td_errors_in_key_order(
    latest: dict[str, float], agent_ids: Sequence[str] | None, revision: int
) -> set[str]:
    """experience_td_error_update's write on PostgreSQL, in one statement that locks the rows
    in key order (rows_locked's rule) and returns the ids it updated. Django's bulk_update
    (one CASE per column over every id) took 86 ms for 256 rows at 10^6, this 11 ms."""
    table = connection.ops.quote_name(Experience._meta.db_table)
    ids = list(latest)
    agents = "" if agent_ids is None else "AND agent_id = ANY(%s) "
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS target SET td_error = given.td_error, "
            "priority = given.priority, revision = %s "
            f"FROM (SELECT id, experience_id FROM {table} WHERE experience_id = ANY(%s) {agents}"
            "ORDER BY id FOR NO KEY UPDATE) AS locked "
            "JOIN unnest(%s::text[], %s::float8[], %s::float8[]) "
            "AS given (experience_id, td_error, priority) "
            "ON given.experience_id = locked.experience_id "
            "WHERE target.id = locked.id RETURNING locked.experience_id",
            [
                revision,
                ids,
                *([] if agent_ids is None else [list(agent_ids)]),
                ids,
                [latest[eid] for eid in ids],
                [priority_from_td_error(latest[eid]) for eid in ids],
            ],
        )
        return {eid for (eid,) in cursor.fetchall()}


@transaction.atomic
def experience_curate(
    *, experience: Experience, td_error: float | None, priority: float | None
) -> Experience:
    """A curator's edit: a priority given is kept as is (an override); a TD error given without
    a priority sets the priority it implies."""
    if priority is not None and not (math.isfinite(priority) and priority >= 0):
        raise ValueError("priority must be a finite number >= 0")
    experience.td_error = td_error
    if priority is not None:
        experience.priority = priority
    elif td_error is not None:
        experience.priority = priority_from_td_error(td_error)
    experience.revision = revision_take(name=REVISION)
    experience.save(update_fields=["td_error", "priority", "revision"])
    return experience


@transaction.atomic
def experience_reset_priority_to_max(*, queryset: QuerySet[Experience]) -> int:
    """Give each selected experience its agent's current max priority."""
    revision = revision_take(name=REVISION)
    selected = list(rows_locked(queryset, update_only=True).values_list("id", "agent_id"))
    tops = _agent_max_priorities(agent for _, agent in selected)
    rows = [
        Experience(id=pk, priority=tops.get(agent) or INITIAL_MAX_PRIORITY, revision=revision)
        for pk, agent in selected
    ]
    Experience.objects.bulk_update(rows, ["priority", "revision"], batch_size=1000)
    return len(rows)


@transaction.atomic
def experience_recompute_priority(*, queryset: QuerySet[Experience]) -> int:
    """Priority from the TD error again (undoing overrides); items with no TD error are left."""
    revision = revision_take(name=REVISION)
    rows = [
        Experience(id=pk, priority=priority_from_td_error(td), revision=revision)
        for pk, td in rows_locked(queryset.exclude(td_error=None), update_only=True).values_list(
            "id", "td_error"
        )
        if td is not None
    ]
    Experience.objects.bulk_update(rows, ["priority", "revision"], batch_size=1000)
    return len(rows)


def _count_inserts_and_evict(rows: list[Experience]) -> None:
    """Count new rows into their agents' ReplayState and, past an agent's max_size, remove
    items by its remover, in the insert's transaction and through the same tombstones as a
    delete. A list larger than the capacity keeps its newest max_size items."""
    added = Counter(row.agent_id for row in rows)
    if not added:
        return
    ReplayState.objects.bulk_create(
        [ReplayState(agent_id=agent) for agent in added], ignore_conflicts=True
    )
    for agent, count in added.items():
        ReplayState.objects.filter(agent_id=agent).update(
            size=F("size") + count, inserts=F("inserts") + count
        )
    capacity = {
        agent: controls
        for agent, controls in replay_controls_many(added).items()
        if controls.max_size
    }
    if not capacity:
        return
    sizes = dict(ReplayState.objects.filter(agent_id__in=capacity).values_list("agent_id", "size"))
    victims: list[int] = []
    for agent, controls in capacity.items():
        excess = sizes[agent] - controls.max_size
        if excess <= 0:
            continue
        mine = Experience.objects.filter(agent_id=agent)
        if added[agent] >= controls.max_size:  # the newest of this list are the ones kept
            newest = sorted(row.pk for row in rows if row.agent_id == agent)[-controls.max_size :]
            doomed = mine.exclude(id__in=newest)
        elif controls.remover == ReplaySettings.Remover.LOWEST_PRIORITY:
            doomed = mine.order_by("priority", "id")[:excess]
        else:
            doomed = mine.order_by("id")[:excess]
        victims += doomed.values_list("id", flat=True)
    if victims:
        revision_delete(
            queryset=Experience.objects.filter(id__in=victims),
            tombstone=ExperienceTombstone,
            record=_count_evicted,
        )


def _count_down(doomed: Doomed, *, evicted: bool = False) -> None:
    """The delete's part in its agents' counters: sizes down (and removals up, for evictions)."""
    for agent, count in Counter(agent for _, agent in doomed).items():
        ReplayState.objects.filter(agent_id=agent).update(
            size=F("size") - count, removals=F("removals") + (count if evicted else 0)
        )


def _count_evicted(doomed: Doomed) -> None:
    _count_down(doomed, evicted=True)


def experience_delete_many(*, queryset: QuerySet[Experience]) -> int:
    """Delete experiences, leaving tombstones so every replay index drops them."""
    return revision_delete(queryset=queryset, tombstone=ExperienceTombstone, record=_count_down)


def experience_erase_agent(*, agent_id: str) -> dict[str, int]:
    """Delete every experience of the agent (tombstones for the replay trees), its dream
    cycles with their draws, and its replay settings, counters and their snapshots, in chunks:
    complete in one call whatever the count."""
    experiences = revision_delete_all(
        queryset=Experience.objects.filter(agent_id=agent_id),
        tombstone=ExperienceTombstone,
        chunk=PURGE_CHUNK,
    )
    draws = delete_all(DreamCycleItem.objects.filter(cycle__agent_id=agent_id), chunk=PURGE_CHUNK)
    cycles = delete_all(DreamCycle.objects.filter(agent_id=agent_id), chunk=PURGE_CHUNK)
    delete_all(ReplaySnapshot.objects.filter(agent_id=agent_id), chunk=PURGE_CHUNK)
    ReplayState.objects.filter(agent_id=agent_id).delete()
    ReplaySettings.objects.filter(agent_id=agent_id).delete()
    return {"experiences": experiences, "dream_cycles": cycles, "dream_cycle_items": draws}


class _DrawTally:
    """Replay draws of this process, handed to a worker in one task about once a second.

    A task per replay request cost the request its publish (an fsync on the embedded broker,
    ~1 ms on Redis) and the worker a transaction per request. A daemon thread flushes the tally
    every DRAW_FLUSH_SECONDS, or sooner past DRAW_FLUSH_MAX draws; the process flushes what is
    left when it exits (gunicorn's graceful stop, Ctrl-C). A process killed outright loses at
    most its last second of counts: times_sampled is a curation statistic sampling never reads.
    last_sampled_at is the time of the flush's latest draw, so it is exact to the interval."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start empty, dropping what was counted: a forked child's copy is its parent's to
        count, and each test starts afresh. A thread left behind finds it is not the tally's."""
        self._lock = threading.Lock()  # guards the tally
        self._flushing = threading.Lock()  # one flush at a time, so exit waits for the thread's
        self._wake = threading.Event()
        self._draws: Counter[int] = Counter()
        self._count = 0
        self._latest: datetime | None = None
        self._thread: threading.Thread | None = None

    def add(self, pks: Sequence[int], at: datetime) -> None:
        with self._lock:
            self._draws.update(pks)
            self._count += len(pks)
            self._latest = at if self._latest is None else max(self._latest, at)
            if self._count >= DRAW_FLUSH_MAX:
                self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="replay-draw-tally", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(DRAW_FLUSH_SECONDS)
                self._wake.clear()
                if self._thread is not threading.current_thread():
                    return  # forgotten (tests): another thread owns the tally now
                self.flush()
                with self._lock:
                    if not self._count:  # idle: the next draw starts a thread again
                        self._thread = None
                        return
        finally:
            connection.close()  # this thread's, opened if the broker was down

    def flush(self) -> None:
        """Hand every draw counted so far to a worker."""
        with self._flushing:
            with self._lock:
                draws, at = self._draws, self._latest
                self._draws, self._count, self._latest = Counter(), 0, None
            if at is not None:
                _count_later(list(draws.elements()), at)


DRAW_FLUSH_SECONDS = 1.0
DRAW_FLUSH_MAX = 50_000
_tally = _DrawTally()
atexit.register(_tally.flush)
os.register_at_fork(after_in_child=_tally.forget)


def experience_mark_sampled_later(*, pks: Sequence[int], at: datetime | None = None) -> None:
    """Count draws off the request path: a write transaction cost a replay request 20 to 90 ms
    under load, so the draws go to a worker, batched by the process's tally. When Celery runs
    tasks eagerly (tests; no worker) there is nothing to batch for: they are counted now."""
    from .tasks import mark_sampled

    at = at or timezone.now()
    if mark_sampled.app.conf.task_always_eager:
        _count_later(pks, at)
    else:
        _tally.add(pks, at)


def experience_mark_sampled_flush() -> None:
    """Hand this process's tally of draws to a worker now (tests, and before a planned exit)."""
    _tally.flush()


def _count_later(pks: Sequence[int], at: datetime) -> None:
    """Publish experience.mark_sampled; when the broker cannot take the task, the draws are
    counted here and now, and when that fails too they go uncounted: bookkeeping never fails
    a replay request."""
    from .tasks import mark_sampled  # tasks call the services: import on use

    try:
        # No retries: a broker that is down answers at once, and then this process counts.
        mark_sampled.apply_async(
            (list(pks), at.isoformat()),
            retry_policy={"max_retries": 0},
            argsrepr=f"<{len(pks)} draws>",  # Celery's repr of 4,096 ids costs a millisecond
        )
    except OperationalError as exc:
        logger.warning(
            "Counting %d replay draws now: the broker refused the task: %s", len(pks), exc
        )
        try:
            experience_mark_sampled(pks=pks, at=at)
        except DatabaseError:
            logger.exception("%d replay draws went uncounted", len(pks))


def experience_mark_sampled(*, pks: Sequence[int], at: datetime | None = None) -> None:
    """Count each draw (with replacement, an item drawn twice counts twice). Sampling does not
    read these fields, so no revision is taken."""
    at = at or timezone.now()
    counts = Counter(pks)
    if not counts:
        return
    if connection.vendor == "postgresql":
        _count_draws_in_key_order(counts, at)
        return
    # SQLite: one writer at a time holds the database, so no lock order to keep.
    by_count: dict[int, list[int]] = {}
    for pk, count in counts.items():
        by_count.setdefault(count, []).append(pk)
    with transaction.atomic():
        for count, group in by_count.items():
            Experience.objects.filter(id__in=group).update(
                times_sampled=F("times_sampled") + count, last_sampled_at=at
            )


def _count_draws_in_key_order(counts: Counter[int], at: datetime) -> None:
    """experience_mark_sampled on PostgreSQL: one statement that locks the rows in key order
    (rows_locked's rule, which TD updates and deletes keep), then adds each row's count. An
    UPDATE per count locked them in its own scan's order, and deadlocked with those writers.
    As fast as that UPDATE, where locking first in a query of its own cost 2 to 3 ms a draw
    of 256 (bench/replay.py's capped replay)."""
    table = connection.ops.quote_name(Experience._meta.db_table)
    ids = sorted(counts)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS counted SET times_sampled = counted.times_sampled + drawn.count, "
            "last_sampled_at = %s "
            f"FROM (SELECT id FROM {table} WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE) "
            "AS locked JOIN unnest(%s::bigint[], %s::integer[]) AS drawn (id, count) "
            "ON drawn.id = locked.id WHERE counted.id = locked.id",
            [at, ids, ids, [counts[pk] for pk in ids]],
        )


def experience_purge_expired(*, now: datetime | None = None) -> int:
    """Delete retired experiences, then expired ones, in chunks, and tombstones older than
    the retention."""
    now = now or timezone.now()
    retired = revision_delete_all(
        queryset=Experience.objects.filter(retired_at__isnull=False),
        tombstone=ExperienceTombstone,
        chunk=PURGE_CHUNK,
        record=_count_down,
    )
    return retired + revision_purge_expired(
        model=Experience,
        tombstone=ExperienceTombstone,
        now=now,
        chunk=PURGE_CHUNK,
        record=_count_down,
    )
