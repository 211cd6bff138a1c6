"""A full disk: how each storage reports it, the room memory-mapped writers keep free, and
SQLite's WAL files held open so that reads go on.

qdrant-edge and prometheus_client write through memory maps of sparse files: on a full disk the
kernel cannot back a new page, and the process dies of SIGBUS instead of getting an error. So
the index stops writing while less than MIN_FREE_BYTES are free (`require_room`: its writes are
derived, it catches up from the DB later), and the metrics live in memory (gunicorn.conf.py).

In WAL mode, the last connection to close deletes the -wal and -shm files, and the next one to
open creates them again; on a full disk it cannot (the -shm needs 32 KiB), so every new
connection failed with "disk I/O error", reads included. Django closes a thread's connection
when it is CONN_MAX_AGE old, and Celery after a task, so a moment with none open is enough
(with CONN_MAX_AGE 0, any moment with no request in flight). One connection per process
that stays open (and idle: it holds no transaction, so checkpoints are not held back) keeps both
files, and new connections then map the -shm that is already there.
"""

import errno
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# PostgreSQL's disk_full (class 53, insufficient resources); psycopg's errors carry it.
PG_DISK_FULL = "53100"
# Below this the data folder counts as full: the index stops writing and /health says so. A
# catch-up's pages and a SQLite checkpoint take far less; an optimizer's new segment takes
# about the size of the segments it merges, which this margin covers on small indexes only.
MIN_FREE_BYTES = 16 * 1024 * 1024


def write_atomically(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a reader (another process too) sees the old file or
    the new one, never a truncated one, and a kill mid-write leaves the old one."""
    make_atomically(path, lambda temporary: temporary.write_text(text))


def make_atomically(path: Path, make: Callable[[Path], Any]) -> None:
    """`make(temporary)` writes a temporary file of its own in `path`'s folder, which then
    replaces `path`: readers see the old file or the whole new one."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    temporary = Path(name)
    try:
        make(temporary)
        os.chmod(temporary, 0o644)  # as a file written in place would be (mkstemp's is 0600)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def require_room(path: Path) -> int:
    """The bytes free where `path` lives; ENOSPC (answered 507) if fewer than MIN_FREE_BYTES."""
    usage = shutil.disk_usage(path)
    if usage.free < MIN_FREE_BYTES:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: the disk of {path} is full ({usage.free:,} bytes free "
            f"of {usage.total:,}, fewer than the {MIN_FREE_BYTES:,} kept free)",
        )
    return usage.free


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or what caused it, is a full disk, as each storage says it: an OSError
    ENOSPC or EDQUOT (file writes), SQLite's SQLITE_FULL ("database or disk is full"),
    PostgreSQL's 53100, or qdrant-edge's Rust error, which keeps only the OS message."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        if isinstance(current, sqlite3.Error) and "database or disk is full" in str(current):
            return True
        if getattr(current, "sqlstate", None) == PG_DISK_FULL:
            return True
        if "No space left on device" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


_held: dict[str, sqlite3.Connection] = {}
_inherited: list[sqlite3.Connection] = []  # a parent's, after a fork: never used nor closed
_lock = threading.Lock()


def hold_wal_files_in_this_process() -> None:
    """Called where a service process starts (a gunicorn worker, the Celery worker, an index
    server), not in AppConfig.ready: a management command or the test runner needs no holder,
    and the test runner's own one broke its test database (SQLITE_IOERR_SHORT_READ on connect,
    after an erasure's checkpoint and a worker subprocess on the same file)."""
    from django.db.backends.signals import connection_created

    connection_created.connect(hold_wal_files, dispatch_uid="ferrum-hold-wal-files")


def hold_wal_files(sender: Any, connection: Any, **kwargs: Any) -> None:
    """On the connection_created signal: the first SQLite connection to a file opens its holder."""
    if connection.vendor != "sqlite" or connection.is_in_memory_db():
        return
    name = str(connection.settings_dict["NAME"])
    with _lock:
        if name in _held:
            return
        holder = sqlite3.connect(name, check_same_thread=False)
        holder.execute("SELECT count(*) FROM sqlite_master").fetchone()  # maps the -shm
        _held[name] = holder


def _after_fork_in_child() -> None:
    # Closing a parent's connection in a child is unsafe in SQLite; keep it, take a new one.
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at the fork
    _inherited.extend(_held.values())
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
