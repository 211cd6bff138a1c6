"""The working-memory store, on both engines: the database table and a real Redis."""

import time
import uuid

import pytest
from django.utils import timezone

from sessions.models import WorkingMemoryEntry
from sessions.services import session_close, session_start, session_update
from sessions.working_memory import (
    DatabaseStore,
    RedisStore,
    VersionConflict,
    WorkingMemoryUnavailable,
    get_working_memory,
    redacted,
    reset_working_memory,
)

pytestmark = pytest.mark.django_db


def state(version: int = 1, **extra: object) -> dict[str, object]:
    return {"agent_id": "a", "version": version, "messages": [], **extra}


def seconds_left(store, session_id: str) -> float:
    if isinstance(store, RedisStore):
        return store.ttl_ms(session_id=session_id) / 1000
    expires_at = WorkingMemoryEntry.objects.get(session_id=session_id).expires_at
    return (expires_at - timezone.now()).total_seconds()


def test_the_configured_engine_is_used(store_engine):
    store = get_working_memory()
    assert store.engine == store_engine
    assert get_working_memory() is store  # one per process
    assert store.ping()["engine"] == store_engine


def test_a_state_round_trips(store_engine):
    store, sid = get_working_memory(), str(uuid.uuid4())
    assert store.get(session_id=sid) is None
    store.create(session_id=sid, state=state(facts=["x"], text="naïve ✓"), ttl=60)
    assert store.get(session_id=sid) == state(facts=["x"], text="naïve ✓")
    store.delete(session_id=sid)
    assert store.get(session_id=sid) is None


def test_replace_is_a_compare_and_set_on_the_version(store_engine):
    store, sid = get_working_memory(), str(uuid.uuid4())
    store.create(session_id=sid, state=state(1), ttl=60)
    store.replace(session_id=sid, expected_version=1, state=state(2, step=1), ttl=60)
    with pytest.raises(VersionConflict) as lost:
        store.replace(session_id=sid, expected_version=1, state=state(2, step=9), ttl=60)
    assert lost.value.current == 2
    assert store.get(session_id=sid) == state(2, step=1)
    with pytest.raises(VersionConflict) as gone:
        store.replace(session_id=str(uuid.uuid4()), expected_version=1, state=state(2), ttl=60)
    assert gone.value.current is None


def test_each_update_refreshes_the_ttl(store_engine):
    store, sid = get_working_memory(), str(uuid.uuid4())
    store.create(session_id=sid, state=state(1), ttl=5)
    assert 3 < seconds_left(store, sid) <= 5
    store.replace(session_id=sid, expected_version=1, state=state(2), ttl=600)
    assert 590 < seconds_left(store, sid) <= 600


def test_a_state_is_gone_when_its_ttl_ends(store_engine):
    store, sid = get_working_memory(), str(uuid.uuid4())
    store.create(session_id=sid, state=state(1), ttl=1)
    time.sleep(1.2)
    assert store.get(session_id=sid) is None
    with pytest.raises(VersionConflict) as gone:
        store.replace(session_id=sid, expected_version=1, state=state(2), ttl=60)
    assert gone.value.current is None


def test_the_database_keeps_expired_states_for_the_sweep_until_purged(settings):
    settings.REDIS_URL = ""
    store, sid = get_working_memory(), str(uuid.uuid4())
    assert isinstance(store, DatabaseStore)
    store.create(session_id=sid, state=state(1), ttl=1)
    time.sleep(1.1)
    assert store.get(session_id=sid) is None
    assert store.get(session_id=sid, include_expired=True) == state(1)
    assert store.purge_expired(now=timezone.now()) == 1
    assert store.get(session_id=sid, include_expired=True) is None


def test_creating_an_existing_redis_key_fails(redis_url, settings):
    settings.REDIS_URL = redis_url
    store, sid = get_working_memory(), str(uuid.uuid4())
    store.create(session_id=sid, state=state(1), ttl=60)
    with pytest.raises(Exception, match="exists"):
        store.create(session_id=sid, state=state(1), ttl=60)
    assert store.purge_expired(now=timezone.now()) == 0  # Redis expires keys itself


def test_redis_down_is_a_clear_503_and_hides_the_password(settings):
    settings.REDIS_URL = "redis://:hunter2@127.0.0.1:1/0"
    store = get_working_memory()
    for call in (
        store.ping,
        lambda: store.get(session_id="s"),
        lambda: store.create(session_id="s", state=state(1), ttl=1),
        lambda: store.replace(session_id="s", expected_version=1, state=state(2), ttl=1),
        lambda: store.delete(session_id="s"),
    ):
        with pytest.raises(WorkingMemoryUnavailable) as down:
            call()
        assert down.value.status_code == 503
        assert "Redis at redis://:***@127.0.0.1:1/0 does not answer" in down.value.message
        assert "hunter2" not in down.value.message


def test_redacted_leaves_urls_without_password_alone():
    assert redacted("redis://127.0.0.1:6379/15") == "redis://127.0.0.1:6379/15"
    assert redacted("redis://u:p@h/0") == "redis://u:***@h/0"


def test_changing_redis_url_switches_engine(settings, redis_url):
    settings.REDIS_URL = ""
    assert get_working_memory().engine == "database"
    settings.REDIS_URL = redis_url
    assert get_working_memory().engine == "redis"
    reset_working_memory()
    assert get_working_memory().engine == "redis"


def test_closing_brings_the_sessions_row_to_its_states_version(store_engine):
    # As if a process died between the state's write and its row's: the state is at 2.
    session, first = session_start(agent_id="a", fields={})
    get_working_memory().replace(
        session_id=str(session.pk), expected_version=1, state={**first, "version": 2}, ttl=60
    )
    consolidation = session_close(session_id=session.pk)
    session.refresh_from_db()
    assert (session.version, consolidation.version) == (2, 2)


def test_an_update_is_one_commit_with_the_database_store(store_engine, monkeypatch):
    """A kill between the state's write and its row's cannot be timed in a test; a failure at
    that point stands for it. The database store rolls the state back, Redis cannot."""
    session, _ = session_start(agent_id="a", fields={})

    def fail(*args: object, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("killed here")

    # Called for the row's update, after the state's write.
    monkeypatch.setattr("sessions.services._times", fail)
    with pytest.raises(RuntimeError):
        session_update(session_id=session.pk, version=1, fields={"step": 1})
    monkeypatch.undo()
    state = get_working_memory().get(session_id=str(session.pk))
    assert state is not None
    assert state["version"] == (1 if store_engine == "database" else 2)
