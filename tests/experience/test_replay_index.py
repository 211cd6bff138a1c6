import random
import time
from functools import partial

import pytest
from django.db import transaction

from experience.models import Experience, ReplayState
from experience.replay_index import ReplayIndex
from experience.replay_services import replay_settings_put
from experience.services import (
    experience_create_many,
    experience_delete_many,
    experience_purge_expired,
    experience_td_error_update,
)
from tests.concurrency import run_together
from tests.experience.factories import experience_json, experience_jsons, store


def db_priorities(agent_id: str | None = None) -> dict[int, float]:
    rows = (
        Experience.objects.all()
        if agent_id is None
        else Experience.objects.filter(agent_id=agent_id)
    )
    return dict(rows.values_list("id", "priority"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("max_size", [0, 7], ids=["no-capacity", "evicting"])
def test_concurrent_writers_never_lose_a_committed_write(max_size):
    """Writers insert, re-prioritise and delete in parallel, some holding their transaction
    open after writing, while a reader catches up continuously. Afterwards the index must
    equal the DB exactly: a write skipped by the cursor would never be read again. With a
    capacity, inserts also evict (fifo for one agent, lowest priority for the other) in their
    transactions, and each agent's counted size must equal its rows."""
    index = ReplayIndex()
    if max_size:
        for agent, remover in (("agent-0", "fifo"), ("agent-1", "lowest_priority")):
            replay_settings_put(agent_id=agent, values={"max_size": max_size, "remover": remover})

    def writer(number: int) -> None:
        rng = random.Random(number)
        mine: list[str] = []
        for step in range(30):
            with transaction.atomic():
                action = rng.random()
                if mine and action < 0.3:
                    experience_td_error_update(updates=[(rng.choice(mine), rng.uniform(-5, 5))])
                elif mine and action < 0.4:
                    victim = mine.pop(rng.randrange(len(mine)))
                    experience_delete_many(queryset=Experience.objects.filter(experience_id=victim))
                else:
                    payload = experience_json(
                        id=f"w{number}-{step}", agent_id=f"agent-{number % 2}"
                    )
                    payload["experience_id"] = payload.pop("id")
                    experience_create_many(items=[payload])
                    mine.append(payload["experience_id"])
                time.sleep(rng.uniform(0, 0.004))  # commit late, still holding the revision

    run_together([partial(writer, n) for n in range(4)], until_done=index.catch_up)
    index.catch_up()
    assert len(db_priorities()) > (12 if max_size else 40)
    assert index.priorities() == db_priorities()
    for agent in ("agent-0", "agent-1"):
        assert index.priorities(agent) == db_priorities(agent)
        state = ReplayState.objects.get(agent_id=agent)
        assert state.size == Experience.objects.filter(agent_id=agent).count()
        if max_size:
            assert 0 < state.size <= max_size and state.removals > 10


@pytest.mark.django_db
def test_deletes_reach_the_index_through_tombstones():
    index = ReplayIndex()
    rows = [store(), store()]
    index.catch_up()
    experience_delete_many(queryset=Experience.objects.filter(pk=rows[0].pk))
    index.catch_up()
    assert set(index.priorities()) == {rows[1].pk}
    assert set(index.priorities("agent-a")) == {rows[1].pk}


@pytest.mark.django_db
def test_an_index_behind_the_tombstone_horizon_rebuilds(settings):
    stale, fresh = ReplayIndex(), ReplayIndex()
    rows = [store(), store(), store()]
    stale.catch_up()
    experience_delete_many(queryset=Experience.objects.filter(pk=rows[0].pk))
    settings.REPLAY_TOMBSTONE_RETENTION = -1  # purge every tombstone now
    experience_purge_expired()
    assert not Experience.objects.filter(pk=rows[0].pk).exists()
    stale.catch_up()  # its cursor predates purged tombstones: it must rebuild, not trust them
    fresh.catch_up()
    assert stale.priorities() == fresh.priorities() == db_priorities()


@pytest.mark.django_db
def test_catch_up_with_nothing_new_reads_nothing(django_assert_num_queries):
    index = ReplayIndex()
    store()
    index.catch_up()
    with django_assert_num_queries(1):  # only the revision counter
        index.catch_up()


@pytest.mark.django_db
def test_a_batch_of_items_shares_one_revision_and_arrives_whole():
    index = ReplayIndex()
    items = []
    for payload in experience_jsons(50):
        payload["experience_id"] = payload.pop("id")
        items.append(payload)
    experience_create_many(items=items)
    assert Experience.objects.values("revision").distinct().count() == 1
    index.catch_up()
    assert index.priorities() == db_priorities()


@pytest.mark.django_db
def test_a_build_streamed_in_chunks_holds_every_agent_and_expiry(monkeypatch):
    # Three rows a chunk: agents and expiry times cross chunk boundaries.
    monkeypatch.setattr("experience.replay_index.BUILD_CHUNK", 3)
    for i in range(10):
        store(agent_id=f"agent-{i % 3}", td_error=0.1 * i, ttl_seconds=3600 if i == 7 else None)
    index = ReplayIndex()
    index.catch_up()
    assert index.priorities() == db_priorities()
    for agent in ("agent-0", "agent-1", "agent-2"):
        assert index.priorities(agent) == db_priorities(agent)
    expiry = Experience.objects.get(expires_at__isnull=False).expires_at
    assert expiry is not None
    assert index._next_expiry["agent-1"] == pytest.approx(expiry.timestamp())
    assert index._next_expiry["agent-0"] == index._next_expiry["agent-2"] == float("inf")
