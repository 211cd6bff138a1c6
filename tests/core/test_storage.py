"""A full disk, part by part (the whole service on a full tmpfs: tests/faults/test_disk_full.py):
each storage's way of saying it, the one 507 the API answers, the throttle and /health, and
SQLite's WAL files held open."""

import errno
import json
import sqlite3
import threading
import types
from pathlib import Path

import psycopg
import pytest
from django.core.cache.backends.filebased import FileBasedCache
from django.db import OperationalError
from django.db.backends.signals import connection_created
from rest_framework.test import APIRequestFactory

from ferrum_memory.core import storage
from ferrum_memory.core.exceptions import DISK_FULL, Unavailable, api_exception_handler
from ferrum_memory.core.models import ApiKey
from ferrum_memory.core.throttling import ApiKeyRateThrottle
from tests.faults.conftest import small_filesystem


def sqlite_full_error() -> sqlite3.OperationalError:
    """A real SQLITE_FULL: a database capped at its current pages takes one row too many."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.execute("PRAGMA max_page_count = 2")
    try:
        conn.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,))
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("SQLite took a row past its page cap")


def wrapped(cause: BaseException) -> OperationalError:
    """As Django raises it: its own class, the driver's error as the cause."""
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


def test_each_storage_reports_a_full_disk_its_own_way_and_all_are_recognised():
    full = sqlite_full_error()
    assert full.sqlite_errorcode == sqlite3.SQLITE_FULL
    assert storage.is_disk_full(full)
    assert storage.is_disk_full(wrapped(full))
    assert storage.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert storage.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # PostgreSQL's class 53100 (disk_full), as psycopg raises it.
    assert storage.is_disk_full(wrapped(psycopg.errors.DiskFull("could not extend file")))
    # qdrant-edge's Rust errors keep only the OS message.
    assert storage.is_disk_full(RuntimeError("Service internal error: No space left on device"))

    assert not storage.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not storage.is_disk_full(wrapped(sqlite3.OperationalError("no such table: x")))
    assert not storage.is_disk_full(wrapped(psycopg.errors.TooManyConnections("too many")))
    assert not storage.is_disk_full(ValueError("bad input"))


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(lambda: wrapped(sqlite_full_error()), id="sqlite"),
        # No PostgreSQL disk can be filled here (the server is shared): psycopg's own class.
        pytest.param(lambda: wrapped(psycopg.errors.DiskFull("could not extend")), id="postgres"),
        pytest.param(lambda: OSError(errno.ENOSPC, "No space left on device"), id="file"),
    ],
)
def test_the_api_answers_a_full_disk_with_507_and_a_clear_json_error(error):
    answer = api_exception_handler(error(), {})
    assert answer is not None
    assert answer.status_code == 507
    assert answer.data == {"detail": DISK_FULL}


def test_other_errors_keep_their_answers():
    assert api_exception_handler(OSError(errno.EACCES, "Permission denied"), {}) is None  # 500
    unavailable = api_exception_handler(Unavailable("The index is down."), {})
    assert unavailable is not None and unavailable.status_code == 503


def test_the_throttle_lets_requests_through_when_its_file_cache_cannot_write(tmp_path):
    throttle = ApiKeyRateThrottle()
    # A budget under 100 writes the shared counter on every request (a larger one batches its
    # writes), so each request below reaches the cache.
    throttle.rate = "50/min"
    ApiKeyRateThrottle.forget_windows()
    request = APIRequestFactory().get("/memory/")
    request.auth = ApiKey(pk=1)
    with small_filesystem(tmp_path / "full", 1) as folder:
        with (folder / "ballast").open("wb") as ballast, pytest.raises(OSError):
            while True:
                ballast.write(b"\0" * 65536)
                ballast.flush()
        # The embedded service's cache, as settings make it, on a disk with no room left.
        throttle.cache = FileBasedCache(str(folder / "cache"), {})
        assert throttle.allow_request(request, None) is True  # type: ignore[arg-type]
    throttle.cache = FileBasedCache(str(tmp_path / "cache"), {})
    (tmp_path / "cache").rmdir()
    (tmp_path / "cache").write_text("")  # a file where its folder was
    with pytest.raises(OSError) as raised:  # any other failure is a real fault and stays one
        throttle.allow_request(request, None)  # type: ignore[arg-type]
    assert not storage.is_disk_full(raised.value)


@pytest.mark.django_db
def test_health_names_the_storage_while_the_data_folder_is_nearly_full(anon_client, monkeypatch):
    assert anon_client.get("/health").json()["backends"]["storage"]["status"] == "ok"
    # This machine's disk cannot be filled: the margin is raised past what it has free.
    monkeypatch.setattr(storage, "MIN_FREE_BYTES", 2**62)
    answer = anon_client.get("/health")
    assert answer.status_code == 503
    assert answer.json()["failed"] == ["storage"]
    assert "is full" in answer.json()["backends"]["storage"]["error"]
    with pytest.raises(OSError) as raised:
        storage.require_room(Path("."))
    assert storage.is_disk_full(raised.value)


def fake_connection(path: Path) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        vendor="sqlite", is_in_memory_db=lambda: False, settings_dict={"NAME": str(path)}
    )


def open_and_close(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("SELECT count(*) FROM t").fetchone()
    conn.close()


def test_the_wal_files_outlive_every_connection_but_the_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "_held", {})
    monkeypatch.setattr(storage, "_inherited", [])
    path = tmp_path / "db.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    wal_files = [Path(f"{path}-wal"), Path(f"{path}-shm")]
    open_and_close(path)
    assert not any(f.exists() for f in wal_files)  # the last one out deletes them

    storage.hold_wal_files(None, fake_connection(path))
    storage.hold_wal_files(None, fake_connection(path))  # one holder per file
    assert list(storage._held) == [str(path)]
    open_and_close(path)
    assert all(f.exists() for f in wal_files)  # a new connection now has them to map

    storage._after_fork_in_child()  # a forked child takes its own, never the parent's
    assert storage._held == {} and len(storage._inherited) == 1
    storage._inherited[0].close()


def test_a_service_process_holds_its_sqlite_files_from_its_start(tmp_path, monkeypatch):
    """gunicorn workers, the Celery worker and index servers call this as they start; the test
    runner does not (tests/faults/test_disk_full.py checks the holder through gunicorn)."""
    monkeypatch.setattr(storage, "_held", {})
    path = tmp_path / "db.sqlite3"
    sqlite3.connect(path).close()
    connection_created.send(sender=None, connection=fake_connection(path))
    assert storage._held == {}  # nothing holds it until a service process asks
    storage.hold_wal_files_in_this_process()
    try:
        connection_created.send(sender=None, connection=fake_connection(path))
        assert list(storage._held) == [str(path)]
    finally:
        connection_created.disconnect(dispatch_uid="ferrum-hold-wal-files")
        storage._held.pop(str(path)).close()


def test_a_reader_never_sees_a_file_half_written(tmp_path):
    """Every process loading the embedding model writes the small JSON files of its folder; one
    that read them while another rewrote them found one empty (a 500 in the crash test)."""
    path = tmp_path / "config.json"
    versions = [json.dumps({"version": n, "padding": "x" * 50_000}) for n in range(2)]
    storage.write_atomically(path, versions[0])
    stop = threading.Event()

    def rewrite() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            storage.write_atomically(path, versions[n % 2])

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        seen = {path.read_text() for _ in range(3_000)}
    finally:
        stop.set()
        writer.join()
    assert seen <= set(versions)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left
