"""Writers of the same experience rows at once: the worker counting replay draws, a learner
setting TD errors, a delete. On PostgreSQL each locks rows; taken in different orders, two of
them deadlock and PostgreSQL aborts one (a 503 to its client; seen once in the soak). On SQLite
writers take the database's lock in turn, so this checks the counts there."""

import random
from collections import Counter

import pytest

from experience.models import Experience
from experience.services import (
    experience_create_many,
    experience_delete_many,
    experience_mark_sampled,
    experience_td_error_update,
)
from tests.concurrency import run_together
from tests.experience.factories import experience_jsons

ROWS = 200
ROUNDS = 60


@pytest.mark.django_db(transaction=True)
def test_counting_draws_updating_td_errors_and_deleting_the_same_rows_at_once():
    items = experience_jsons(ROWS, agent_id="agent-locks")
    for item in items:
        item["experience_id"] = item.pop("id")
    stored = [s.experience for s in experience_create_many(items=items)]
    pks = [row.pk for row in stored]
    ids = [row.experience_id for row in stored]
    doomed = set(pks[::10])  # the deleter's rows; the others are counted and updated
    kept = [pk for pk in pks if pk not in doomed]
    drawn: Counter[int] = Counter()

    def count_draws() -> None:
        rng = random.Random(1)
        for _ in range(ROUNDS):
            # With replacement: the rows drawn twice are counted by a second UPDATE, after
            # those drawn once, so each transaction's locks follow no single order of the ids.
            draws = rng.choices(pks, k=ROWS)
            experience_mark_sampled(pks=draws)
            drawn.update(pk for pk in draws if pk not in doomed)

    def update_td_errors() -> None:
        rng = random.Random(2)
        for _ in range(ROUNDS):
            chosen = rng.sample(ids, ROWS // 2)
            experience_td_error_update(updates=[(eid, rng.uniform(-1, 1)) for eid in chosen])

    def delete_some() -> None:
        rng = random.Random(3)
        order = rng.sample(sorted(doomed), len(doomed))
        for start in range(0, len(order), 4):
            experience_delete_many(
                queryset=Experience.objects.filter(pk__in=order[start : start + 4])
            )

    run_together([count_draws, update_td_errors, delete_some])

    counts = dict(Experience.objects.values_list("pk", "times_sampled"))
    assert set(counts) == set(kept)
    assert counts == {pk: drawn[pk] for pk in kept}  # no draw lost, none counted twice
