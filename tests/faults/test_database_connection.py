"""The database failing one request: that request gets a clean JSON 503 (no traceback, a
client retries), and the next one works.

- PostgreSQL, with real processes: gunicorn keeps its connection between requests
  (CONN_MAX_AGE); the test kills that connection's backend with pg_terminate_backend from its
  own, between requests and during one; the next request reconnects (CONN_HEALTH_CHECKS).
  PostgreSQL only: an SQLite "connection" is a file handle with no server end to drop; the
  scaled-out run (scripts/test.sh, always part of CI) runs it.
- SQLite, the embedded equivalent: another process holds the write lock longer than the
  request waits for it ("database is locked")."""

import sqlite3
import threading

import pytest
from django.db import connection, transaction

from ferrum_memory.core.exceptions import DATABASE_FAILED
from tests.experience.test_dream_e2e import wait_for
from tests.faults.conftest import Response, Web, web_process

EXPERIENCE = {"agent_id": "a", "task": "t", "reward": 0.5}


def web_backends(*, waiting_for_a_lock: bool = False) -> list[int]:
    """The PostgreSQL backends of the web process: every other connection to the test DB."""
    with connection.cursor() as cursor:
        # Inside a transaction pg_stat_activity is a snapshot taken at its first read.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND (NOT %s OR wait_event_type = 'Lock')",
            [waiting_for_a_lock],
        )
        return [pid for (pid,) in cursor.fetchall()]


def terminate(pids: list[int]) -> None:
    with connection.cursor() as cursor:
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def stats_work(web: Web) -> None:
    response = web.call("GET", "/experience/stats")
    assert response.status == 200, (response.body, web.logs())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only (see above)")
@pytest.mark.django_db(transaction=True)
def test_a_dropped_connection_fails_one_request_cleanly_and_the_next_one_works(api_key, tmp_path):
    with web_process(tmp_path, api_key[1]) as web:
        stats_work(web)
        assert web_backends(), "the web process keeps its connection between requests"

        # Dropped between requests: the health check at the next request's first query sees
        # it and reconnects, so even that request works.
        terminate(web_backends())
        stats_work(web)

        # Dropped during a request: the request waits on a lock the test holds (the stats'
        # read of the experiences; its API key is cached by now, core/selectors.py), and its
        # backend is killed while it waits.
        answers: list[Response] = []
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("LOCK TABLE experience_experience IN ACCESS EXCLUSIVE MODE")
            request = threading.Thread(
                target=lambda: answers.append(web.call("GET", "/experience/stats"))
            )
            request.start()
            waiting = wait_for(
                lambda: web_backends(waiting_for_a_lock=True), web.logs, "the request to wait"
            )
            terminate(waiting)
            request.join(timeout=60)
        [failed] = answers
        assert failed.status == 503, (failed.body, web.logs())
        assert failed.content_type == "application/json"
        assert failed.json() == {"detail": DATABASE_FAILED}

        stats_work(web)
        created = web.call("POST", "/experience/", {"id": "after-the-drop", **EXPERIENCE})
        assert created.status == 201, created.body


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite equivalent")
@pytest.mark.django_db(transaction=True)
def test_a_locked_sqlite_database_fails_one_request_cleanly_and_the_next_one_works(
    api_client, monkeypatch
):
    # The service waits 20 s for the lock (settings.DATABASES); a short wait keeps this quick.
    # The connection's OPTIONS is the very dict in settings.DATABASES, so the change is undone
    # after the test: left in place, every later test on SQLite waited only 0.2 s for a lock.
    connection.close()
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process writing, for longer than the wait
        body = {"id": "while-locked", **EXPERIENCE}
        locked = api_client.post("/experience/", body, format="json")
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert locked.status_code == 503
    assert locked.json() == {"detail": DATABASE_FAILED}
    created = api_client.post("/experience/", {"id": "after-the-lock", **EXPERIENCE}, format="json")
    assert created.status_code == 201, created.json()
    assert api_client.get("/experience/while-locked").status_code == 404


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's own OperationalErrors")
def test_on_sqlite_only_a_busy_database_is_a_503_other_operational_errors_stay_500s():
    from django.db import OperationalError

    from ferrum_memory.core.exceptions import api_exception_handler

    busy = api_exception_handler(OperationalError("database is locked"), {})
    assert busy is not None and busy.status_code == 503
    # A missing table is a bug to see in the logs as a 500, not an outage to retry.
    assert api_exception_handler(OperationalError("no such table: experience"), {}) is None
