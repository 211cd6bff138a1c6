"""experience_rows and the EpochSeconds it reads timestamps with: the same values as Django's
in_bulk, to the microsecond, on SQLite and PostgreSQL."""

from datetime import UTC, datetime

import orjson
import pytest

from experience.models import Experience
from experience.selectors import (
    ExperienceRow,
    experience_in_bulk,
    experience_in_bulk_by_id,
    experience_rows,
)
from ferrum_memory.core.db_functions import EpochSeconds
from tests.experience.factories import store

pytestmark = pytest.mark.django_db

TIMES = [
    datetime(2026, 11, 30, 4, 15, 0, 123456, tzinfo=UTC),
    datetime(2026, 11, 30, 4, 15, 0, tzinfo=UTC),  # no fraction: stored without one
    datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC),  # before the epoch
    datetime(2200, 2, 28, 0, 0, 0, 1, tzinfo=UTC),
]


def rows_with_times() -> list[Experience]:
    rows = [store(td_error=0.5 * i) for i in range(len(TIMES))] + [store(test_result=None)]
    for row, at in zip(rows, TIMES, strict=False):
        Experience.objects.filter(pk=row.pk).update(
            created_at=at, expires_at=None, last_sampled_at=at, times_sampled=2
        )
    return rows


def test_epoch_seconds_are_exact_to_the_microsecond():
    rows = rows_with_times()
    seconds = dict(
        Experience.objects.annotate(at=EpochSeconds("created_at")).values_list("pk", "at")
    )
    assert [seconds[row.pk] for row in rows[: len(TIMES)]] == [at.timestamp() for at in TIMES]
    nulls = Experience.objects.filter(pk=rows[0].pk).values_list(EpochSeconds("expires_at"))
    assert list(nulls) == [(None,)]


def test_experience_rows_read_what_in_bulk_reads():
    pks = [row.pk for row in rows_with_times()]
    Experience.objects.filter(pk=pks[1]).update(passed=False, td_error=None)
    fast = experience_rows([*pks, pks[0], 10**9])  # repeats and unknown keys are fine
    slow = Experience.objects.in_bulk(pks)
    assert fast.keys() == slow.keys()
    for pk, row in slow.items():
        for name in ExperienceRow._fields:
            value = getattr(fast[pk], name)
            if isinstance(value, orjson.Fragment):  # stored JSON, as it will be written
                value = orjson.loads(orjson.dumps(value))
            assert value == getattr(row, name), name
            assert type(value) is type(getattr(row, name)), name  # bool, not SQLite's 0 or 1
        assert slow[pk].test_result is None or isinstance(fast[pk].test_result, orjson.Fragment)
    assert experience_rows([]) == {}


def test_experience_in_bulk_reads_what_in_bulk_reads():
    pks = [row.pk for row in rows_with_times()]
    fast = experience_in_bulk([*pks, pks[0], 10**9])
    slow = Experience.objects.in_bulk(pks)
    assert fast.keys() == slow.keys()
    for pk, row in slow.items():
        for field in Experience._meta.concrete_fields:
            assert getattr(fast[pk], field.attname) == getattr(row, field.attname), field.name
        assert not fast[pk]._state.adding


def test_experience_in_bulk_by_id_reads_what_in_bulk_reads():
    rows = [store(), store(agent_id="agent-b"), store()]
    ids = [rows[0].experience_id, rows[1].experience_id, "not-there"]
    fast = experience_in_bulk_by_id(ids)
    slow = Experience.objects.in_bulk(ids, field_name="experience_id")
    assert fast.keys() == slow.keys() == {rows[0].experience_id, rows[1].experience_id}
    for eid, row in slow.items():
        assert (fast[eid].pk, fast[eid].agent_id, fast[eid].task) == (
            row.pk,
            row.agent_id,
            row.task,
        )
    assert experience_in_bulk_by_id([]) == {} and experience_in_bulk_by_id(["none"]) == {}
