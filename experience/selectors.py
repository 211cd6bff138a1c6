"""Every non-trivial read of the replay buffer."""

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import orjson
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import (
    Avg,
    Count,
    Max,
    Min,
    Q,
    QuerySet,
    StdDev,
    Sum,
    TextField,
)
from django.db.models.functions import Abs, Cast
from django.utils import timezone

from ferrum_memory.core.db_functions import EpochSeconds
from ferrum_memory.core.exceptions import Conflict, NotFound
from ferrum_memory.core.metrics import replay_sample_seconds
from ferrum_memory.core.renderers import json_bytes
from ferrum_memory.core.telemetry import traced

from .models import Experience
from .replay_index import Allowance, BufferTooSmall, get_replay_index


def experience_visible(
    *, agent_ids: Sequence[str] | None = None, now: datetime | None = None
) -> QuerySet[Experience]:
    """Experiences a caller may see: not expired, and of the allowed agents (None: all)."""
    now = now or timezone.now()
    queryset = Experience.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    if agent_ids is not None:
        queryset = queryset.filter(agent_id__in=agent_ids)
    return queryset


def experience_get(*, experience_id: str, agent_ids: Sequence[str] | None = None) -> Experience:
    experience = experience_visible(agent_ids=agent_ids).filter(experience_id=experience_id).first()
    if experience is None:
        raise NotFound(f"No experience '{experience_id}'.")
    return experience


class ExperienceRow(NamedTuple):
    """An experience as a replay batch carries it: the columns the API shows, read in one query
    with no model instance (Experience's __init__ was a third of a replay request's CPU). The
    JSON columns are their stored text, as orjson.Fragment."""

    pk: int
    experience_id: str
    agent_id: str
    session_id: str
    task: str
    tool_calls: Any
    test_result: Any
    passed: bool | None
    reward: float
    td_error: float | None
    priority: float
    metadata: Any
    created_at: datetime
    expires_at: datetime | None
    times_sampled: int
    last_sampled_at: datetime | None
    retired_at: datetime | None


def _column(name: str) -> Any:
    """How experience_rows selects a column. Timestamps as epoch seconds and JSON as text:
    Django's converters (a pure-Python timestamp parser on psycopg 3, json.loads) cost more
    than datetime.fromtimestamp and orjson."""
    if name.endswith("_at"):
        return EpochSeconds(name)
    if name in ("tool_calls", "test_result", "metadata"):
        return Cast(name, TextField())
    return name


def _quoted(*names: str) -> str:
    return ".".join(connections[DEFAULT_DB_ALIAS].ops.quote_name(name) for name in names)


def _in_one_parameter(column: str) -> str:
    """SQL for `column` in a list bound as one parameter (see _one_parameter): a PostgreSQL
    array, or a JSON list on SQLite. Binding hundreds of values one by one (`__in`) cost more
    than running the query: psycopg's client-side binding splits the SQL at each one."""
    if connections[DEFAULT_DB_ALIAS].vendor == "postgresql":
        return f"{column} = ANY(%s)"
    return f"{column} IN (SELECT value FROM json_each(%s))"


def _one_parameter(values: list[Any]) -> Any:
    if connections[DEFAULT_DB_ALIAS].vendor == "postgresql":
        return values
    return json_bytes(values).decode()


@functools.cache
def _rows_sql(vendor: str) -> str:
    """SELECT the row columns WHERE the primary key is in one parameter; compiled once (per
    database vendor, for tests that switch)."""
    columns = [_column(name) for name in ("id", *ExperienceRow._fields[1:])]
    query = Experience.objects.values_list(*columns).query
    select, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    assert not params
    return f"{select} WHERE {_in_one_parameter(_quoted(Experience._meta.db_table, 'id'))}"


def _stored_json(text: str | None) -> orjson.Fragment | None:
    # Written into the response as stored, neither parsed nor encoded again (orjson.loads
    # of the JSON columns was a fifth of a replay request's CPU).
    return None if text is None else orjson.Fragment(text)


def parse_stored_json(value: orjson.Fragment | None) -> Any:
    return None if value is None else orjson.loads(orjson.dumps(value))


def experience_rows(pks: Iterable[int]) -> dict[int, ExperienceRow]:
    """{pk: its row} for the pks that exist (repeats and unknown pks are fine)."""
    wanted = sorted(set(pks))
    if not wanted:
        return {}
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cursor:
        cursor.execute(_rows_sql(connection.vendor), [_one_parameter(wanted)])
        fetched = cursor.fetchall()
    # In the default zone, which the output serializer writes without converting.
    zone = timezone.get_default_timezone()

    def time(value: float | None) -> datetime | None:
        return None if value is None else datetime.fromtimestamp(value, zone)

    # Positional (fields in _rows_sql's order): a NamedTuple built by keywords took twice as long.
    return {
        r[0]: ExperienceRow(
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            _stored_json(r[5]),
            _stored_json(r[6]),
            None if r[7] is None else bool(r[7]),  # SQLite gives 0 or 1
            r[8],
            r[9],
            r[10],
            _stored_json(r[11]),
            datetime.fromtimestamp(r[12], zone),
            time(r[13]),
            r[14],
            time(r[15]),
            time(r[16]),
        )
        for r in fetched
    }


def experience_in_bulk(pks: Iterable[int]) -> dict[int, Experience]:
    """Experience.objects.in_bulk(pks), read by experience_rows (`revision` is deferred)."""
    names = ["id", *ExperienceRow._fields[1:]]  # the model's field order
    return {
        pk: Experience.from_db(
            DEFAULT_DB_ALIAS,
            names,
            row._replace(
                tool_calls=parse_stored_json(row.tool_calls),
                test_result=parse_stored_json(row.test_result),
                metadata=parse_stored_json(row.metadata),
            ),
        )
        for pk, row in experience_rows(pks).items()
    }


def experience_in_bulk_by_id(experience_ids: Sequence[str]) -> dict[str, Experience]:
    """Experience.objects.in_bulk(experience_ids, field_name="experience_id"), with the ids
    in one parameter: a list POST asks about 1,000 ids, which usually do not exist yet."""
    if not experience_ids:
        return {}
    column = _in_one_parameter(_quoted("experience_id"))
    sql = f"SELECT id FROM {_quoted(Experience._meta.db_table)} WHERE {column}"
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(sql, [_one_parameter(list(experience_ids))])
        pks = [pk for (pk,) in cursor.fetchall()]
    return {row.experience_id: row for row in experience_in_bulk(pks).values()}


def experience_list(
    *, agent_ids: Sequence[str] | None = None, filters: dict[str, Any]
) -> QuerySet[Experience]:
    queryset = experience_visible(agent_ids=agent_ids)
    for field in ("agent_id", "session_id"):
        if filters.get(field):
            queryset = queryset.filter(**{field: filters[field]})
    if filters.get("passed") is not None:
        queryset = queryset.filter(passed=filters["passed"])
    if filters.get("sampled") is not None:
        queryset = (
            queryset.filter(times_sampled__gt=0)
            if filters["sampled"]
            else queryset.filter(times_sampled=0)
        )
    return queryset.order_by("-id")


def experience_stats(*, agent_ids: Sequence[str] | None = None) -> dict[str, Any]:
    queryset = experience_visible(agent_ids=agent_ids)
    summary = queryset.aggregate(
        count=Count("id"),
        reward_mean=Avg("reward"),
        reward_std=StdDev("reward"),
        reward_min=Min("reward"),
        reward_max=Max("reward"),
        with_test_result=Count("id", filter=Q(passed__isnull=False)),
        passed=Count("id", filter=Q(passed=True)),
        td_error_count=Count("id", filter=Q(td_error__isnull=False)),
        td_error_abs_mean=Avg(Abs("td_error")),
        td_error_min=Min("td_error"),
        td_error_max=Max("td_error"),
        priority_mean=Avg("priority"),
        priority_min=Min("priority"),
        priority_max=Max("priority"),
        priority_sum=Sum("priority"),
        oldest=Min("created_at"),
        newest=Max("created_at"),
        sampled_total=Sum("times_sampled"),
        never_sampled=Count("id", filter=Q(times_sampled=0)),
    )
    by_agent = dict(
        queryset.values("agent_id")
        .annotate(n=Count("id"))
        .order_by("agent_id")
        .values_list("agent_id", "n")
    )
    tested = summary.pop("with_test_result")
    passed = summary.pop("passed")
    return {
        "count": summary["count"],
        "count_by_agent": by_agent,
        "reward": {k: summary[f"reward_{k}"] for k in ("mean", "std", "min", "max")},
        "pass_rate": passed / tested if tested else None,
        "with_test_result": tested,
        "td_error": {
            "count": summary["td_error_count"],
            "abs_mean": summary["td_error_abs_mean"],
            "min": summary["td_error_min"],
            "max": summary["td_error_max"],
        },
        "priority": {k: summary[f"priority_{k}"] for k in ("mean", "min", "max", "sum")},
        "oldest": summary["oldest"],
        "newest": summary["newest"],
        "times_sampled": summary["sampled_total"] or 0,
        "never_sampled": summary["never_sampled"],
    }


@dataclass(frozen=True)
class ReplayItem:
    experience: ExperienceRow
    probability: float
    weight: float


@dataclass(frozen=True)
class ReplayBatch:
    strategy: str
    buffer_size: int
    alpha: float
    beta: float
    seed: int | None
    items: list[ReplayItem]
    retired: list[int] = dataclasses.field(default_factory=list)  # pks the cap retired


@traced(
    "replay.sample",
    lambda **call: {
        "strategy": call["strategy"],
        "batch_size": call["batch_size"],
        "agent_id": call.get("agent_id") or "",
    },
    result_count=lambda batch: len(batch.items),
    latency=lambda **call: replay_sample_seconds(call["strategy"]),
)
def replay_sample(
    *,
    strategy: str,
    batch_size: int,
    alpha: float,
    beta: float,
    half_life: float,
    agent_id: str | None = None,
    seed: int | None = None,
    min_size: int = 1,
    stratified: bool = False,
    allowance: Allowance | None = None,
) -> ReplayBatch:
    """Draw a batch with replacement from the live replay index (caught up with the DB first).

    Raises Conflict (409) when the buffer holds fewer than `min_size` sampleable experiences.
    `allowance`: the sampling cap's draw (replay_services.replay_draw).
    """
    rng = np.random.default_rng(seed)
    try:
        sample = get_replay_index().sample(
            strategy=strategy,
            batch_size=batch_size,
            rng=rng,
            agent_id=agent_id,
            alpha=alpha,
            configured_alpha=settings.REPLAY_ALPHA,
            beta=beta,
            half_life=half_life,
            min_size=min_size,
            stratified=stratified,
            allowance=allowance,
        )
    except BufferTooSmall as exc:
        scope = f"agent '{agent_id}'" if agent_id else "the buffer"
        raise Conflict(
            f"Not enough experiences to sample: {scope} holds {exc.size} sampleable, "
            f"min_size is {min_size}.",
            buffer_size=exc.size,
            min_size=min_size,
        ) from None
    keys = sample.keys.tolist()
    rows = experience_rows(keys)
    probabilities, weights = sample.probabilities.tolist(), sample.weights.tolist()
    items = [
        ReplayItem(rows[key], p, w)
        for key, p, w in zip(keys, probabilities, weights, strict=True)
        if key in rows  # deleted between the catch-up and this read: leave it out
    ]
    return ReplayBatch(strategy, sample.buffer_size, alpha, beta, seed, items, sample.retired)
