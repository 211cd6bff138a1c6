"""Index servers: the embedded vector index in processes of its own, so that building its graphs
stalls no request.

qdrant-edge builds a segment's graphs (`optimize`) and loads a shard holding the GIL (measured:
a thread running either stops every other thread of the process for the whole call, 1 to 10 s
at 10^4 to 10^5 points of one agent), and a shard opens in one process only. So when
VECTOR_INDEX_SERVERS is N > 0, `manage.py memory_index_server` runs N server processes, each
owning one shard folder, catching it up from the DB and answering searches over a Unix socket;
web and worker processes hold no index (a `RemoteVectorIndex` asks a server instead).

A server builds graphs only when its catch-ups have added enough points since the last build
(`VectorIndex.optimize_due`), one server at a time (a file lock), and first says so (a busy
file) so that clients send to another server; a client whose server turns busy before it
answers (a build that began after the request was sent) asks the next one. Each server
catches up from the DB before every search, as every process did before, so a store is
searchable on every server once it returns (read-your-writes).

Requests are pickled over a socket in the data folder, which only this user may open.
"""

import fcntl
import logging
import os
import pickle
import select
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections

from ferrum_memory.core.exceptions import Unavailable

from . import vector_index

logger = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
# How often a client waiting for an answer looks whether its server began building graphs
# (then it asks the next one), and how long it waits for an answer at most.
BUSY_CHECK_SECONDS = 0.02
LAST_TRY_SECONDS = 60.0
# A busy server's clients keep sending for a moment (they read the busy file just before):
# it answers them before it stops for the build.
BUSY_GRACE_SECONDS = 0.05
OPTIMIZE_POLL_SECONDS = 0.2


def server_dir() -> Path:
    return settings.DATA_DIR / "qdrant-edge"


def socket_path(slot: int) -> Path:
    return server_dir() / f"server-{slot}.sock"


def busy_path(slot: int) -> Path:
    return server_dir() / f"server-{slot}.busy"


def _send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    (size,) = HEADER.unpack(_read_exactly(sock, HEADER.size))
    return pickle.loads(_read_exactly(sock, size))  # our own processes, on a 0600 socket


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("index server closed the connection")
        data += chunk
    return bytes(data)


# The server ------------------------------------------------------------------------------------


class IndexServer:
    """One server process: its own shard, a socket, and a thread that builds graphs."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.index = vector_index.VectorIndex(
            vector_index.EdgeEngine(server_dir()), optimize_inline=False
        )
        self._stopping = threading.Event()
        self._closed = threading.Event()  # serve_forever has closed its socket and index
        self._server: socketserver.ThreadingUnixStreamServer | None = None

    def handle(self, op: str, kwargs: dict[str, Any]) -> Any:
        if op == "search":
            return self.index.search(**kwargs)
        if op == "catch_up":
            return self.index.catch_up()
        if op == "rebuild":
            return self.index.rebuild()
        if op == "cursor":
            return self.index.cursor
        raise ValueError(f"unknown index server operation {op!r}")

    def optimize_when_due(self) -> bool:
        """Build graphs if due, one server at a time, marked busy meanwhile; True if it did."""
        if not self.index.optimize_due():
            return False
        with open(server_dir() / "optimize.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits (GIL released) while another one builds
            busy = busy_path(self.slot)
            busy.touch()
            try:
                time.sleep(BUSY_GRACE_SECONDS)
                started = time.perf_counter()
                self.index.optimize()
                # Points stored during the build are added before clients come back.
                self.index.catch_up()
                logger.info(
                    "index server %s built graphs for %.2f s",
                    self.slot,
                    time.perf_counter() - started,
                )
            finally:
                busy.unlink(missing_ok=True)
        return True

    def _optimizer(self) -> None:
        while not self._stopping.wait(OPTIMIZE_POLL_SECONDS):
            try:
                self.optimize_when_due()
                self.index.save_if_due()
            except Exception:  # the next poll tries again; searches go on
                logger.exception(
                    "index server %s: building graphs or flushing the shard failed", self.slot
                )
            finally:
                close_old_connections()

    def serve_forever(self, *, build_graphs: bool = True) -> None:
        """Answer requests until `shutdown`; with `build_graphs`, a thread builds them when due
        (tests drive `optimize_when_due` themselves)."""
        path = socket_path(self.slot)
        path.unlink(missing_ok=True)
        busy_path(self.slot).unlink(missing_ok=True)
        handle = self.handle

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    while True:
                        try:
                            op, kwargs = _receive(self.request)
                        except (ConnectionError, OSError):
                            return
                        close_old_connections()  # as Django does around each request
                        try:
                            reply: tuple[str, Any] = ("ok", handle(op, kwargs))
                        except Exception as exc:  # noqa: BLE001 - the client raises it
                            reply = ("error", _portable(exc))
                        try:
                            _send(self.request, reply)
                        except OSError:  # the client gave up waiting (it asked another)
                            return
                finally:
                    # The thread ends with its client's socket: its connections end with it.
                    # close_old_connections() kept one younger than CONN_MAX_AGE open until the
                    # garbage collector found it (the soak's database connections grew).
                    connections.close_all()

        old_umask = os.umask(0o177)  # the socket: this user only
        try:
            server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        finally:
            os.umask(old_umask)
        server.daemon_threads = True
        self._server = server
        if build_graphs:
            threading.Thread(target=self._optimizer, name="index-optimizer", daemon=True).start()
        logger.info("index server %s listening on %s", self.slot, path)
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            try:
                self._stopping.set()
                server.server_close()
                path.unlink(missing_ok=True)
                self.index.close()
            finally:
                self._closed.set()  # even when closing failed: shutdown() waits for this

    def shutdown(self) -> None:
        """Stop serve_forever, running in another thread, and wait until it has closed: its
        socket file is gone then, so a socket bound at the same path afterwards (a test's
        stand-in server) is not unlinked by a cleanup that was still to come."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._closed.wait()


def _portable(exc: Exception) -> Exception:
    """`exc` if it survives pickling, else an Unavailable saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any exception's constructor may refuse its args
        return Unavailable(f"vector index server: {type(exc).__name__}: {exc}")
    return exc


# The client ------------------------------------------------------------------------------------


class RemoteVectorIndex:
    """VectorIndex's interface, answered by the index servers."""

    engine_name = "IndexServers"

    def __init__(self, servers: int) -> None:
        self.servers = servers
        self.home = os.getpid() % servers  # spreads the processes over the servers
        self._local = threading.local()  # one connection per server and thread

    @property
    def cursor(self) -> int:
        return int(self._call("cursor", {}))

    def search(self, **kwargs: Any) -> list[Any]:
        return list(self._call("search", kwargs))

    def catch_up(self) -> None:
        self._call("catch_up", {})

    def rebuild(self) -> None:
        """Every server drops its index and rebuilds it from the DB."""
        for slot in range(self.servers):
            self._ask(slot, "rebuild", {}, timeout=None)

    def close(self) -> None:
        for sock in getattr(self._local, "sockets", {}).values():
            sock.close()
        self._local.sockets = {}

    def _order(self) -> list[int]:
        """Servers to ask, the home one first, busy ones last."""
        order = [(self.home + i) % self.servers for i in range(self.servers)]
        return sorted(order, key=lambda slot: busy_path(slot).exists())

    def _call(self, op: str, kwargs: dict[str, Any]) -> Any:
        order = self._order()
        for attempt, slot in enumerate(order):
            last = attempt == len(order) - 1
            try:
                return self._ask(slot, op, kwargs, LAST_TRY_SECONDS, leave_if_busy=not last)
            except (OSError, ConnectionError) as exc:  # busy, refused, gone: the next one
                logger.debug("index server %s did not answer %s: %s", slot, op, exc)
        raise Unavailable(
            "No vector index server answers (is `manage.py memory_index_server` running?)."
        )

    def _ask(
        self,
        slot: int,
        op: str,
        kwargs: dict[str, Any],
        timeout: float | None,
        *,
        leave_if_busy: bool = False,
    ) -> Any:
        """Server `slot`'s answer. With `leave_if_busy`, a server that starts building graphs
        before it answers is left (TimeoutError): waiting for it would take the whole build. A
        slow answer from a server that is not building is waited for: asking the other one too
        would double the work of a loaded machine."""
        sockets: dict[int, socket.socket] = self._local.__dict__.setdefault("sockets", {})
        sock = sockets.get(slot)
        try:
            if sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(str(socket_path(slot)))
                sockets[slot] = sock
            sock.settimeout(timeout)
            _send(sock, (op, kwargs))
            if leave_if_busy:
                deadline = time.monotonic() + (timeout or LAST_TRY_SECONDS)
                while not select.select([sock], [], [], BUSY_CHECK_SECONDS)[0]:
                    if busy_path(slot).exists() or time.monotonic() > deadline:
                        raise TimeoutError(f"index server {slot} is building graphs")
            status, value = _receive(sock)
        except BaseException:
            # A late answer would be read as the next request's: this connection is done.
            sockets.pop(slot, None)
            if sock is not None:
                sock.close()
            raise
        if status == "error":
            raise value
        return value


def serve(slot: int) -> None:
    """Run server `slot` until stopped (`manage.py memory_index_server`)."""
    server = IndexServer(slot)
    vector_index.set_vector_index(server.index)  # this process's own code uses it directly
    try:
        server.index.catch_up()  # build before answering, so the first searches are fast
    except Exception:  # it answers anyway: each search catches up again
        logger.exception("index server %s: first catch-up failed", slot)
    server.serve_forever()
