"""Real processes for the fault tests: the web process as deployed (gunicorn) on the test's
database, and a redis-server of the test's own that the test stops and starts again."""

import http.client
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import require_service
from tests.experience.conftest import send_tasks_to  # noqa: F401 - a fixture
from tests.experience.test_dream_e2e import (
    ROOT,
    empty_broker,
    process_env,
    stop_process,
    wait_for,
    worker_command,
)

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Web:
    """A gunicorn web process; `call` sends one request on a new connection, as a client
    after a pause would."""

    port: int
    key: str
    logs: Callable[[], str]

    def call(self, method: str, path: str, body: Any = None) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(
                method,
                path,
                body=None if body is None else orjson.dumps(body),
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
            )
            answer = conn.getresponse()
            return Response(answer.status, answer.getheader("Content-Type", ""), answer.read())
        finally:
            conn.close()


@contextmanager
def web_process(tmp_path: Path, key: str, **env: str) -> Iterator[Web]:
    """gunicorn (one worker, two threads) on the test's database, with `env` on top of the
    worker's environment (tests/experience/test_dream_e2e.py); always stopped."""
    port = free_port()
    log_path = tmp_path / "web.log"
    environment = {
        **process_env(tmp_path),
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "1",
        "GUNICORN_THREADS": "2",
        **env,
    }
    gunicorn = Path(sys.executable).parent / "gunicorn"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [
                str(gunicorn),
                "ferrum_memory.wsgi:application",
                "--config",
                "gunicorn.conf.py",
                # Its default socket is one per user ($HOME/.gunicorn): leave it to others.
                "--no-control-socket",
            ],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def logs() -> str:
        return f"gunicorn exited: {server.poll()}\n{log_path.read_text()[-6000:]}"

    try:
        wait_for(lambda: server.poll() is not None or answers(port), logs, "gunicorn to listen")
        assert server.poll() is None, logs()
        yield Web(port, key, logs)
    finally:
        stop_process(server, timeout=30)


class RedisServer:
    """A redis-server on a free port, persisting to the test's folder (append-only file), so
    what it held is back after a stop and a start, as with a production Redis."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: answers(self.port), lambda: "", f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None
        assert not answers(self.port)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if not Path(REDIS_SERVER).exists():
        require_service("redis://127.0.0.1:1", f"redis-server binary ({REDIS_SERVER})")
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def worker_process(tmp_path: Path, name: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A Celery worker (solo pool: the task runs in this very process) on the test's database
    and broker (tests/experience/test_dream_e2e.py), logging to `{name}.log`; stopped at the
    end unless the test killed it."""
    log_path = tmp_path / f"{name}.log"
    worker_env = {**process_env(tmp_path), **env}
    empty_broker(worker_env["CELERY_BROKER_URL"])
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            worker_command(name),
            cwd=ROOT,
            env=worker_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: " ready." in log_path.read_text(),
            lambda: log_path.read_text()[-4000:],
            f"worker {name}",
        )
        yield worker
    finally:
        stop_process(worker, timeout=20)


@contextmanager
def small_filesystem(path: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of `megabytes` mounted at `path`, unmounted at the end. Mounting needs root: CI
    runs as root, so there a refusal fails the test instead of skipping it."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0700", "tmpfs", str(path)]
    mounted = subprocess.run(mount, capture_output=True, text=True)
    if mounted.returncode != 0:
        message = f"cannot mount a tmpfs at {path}: {mounted.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield path
    finally:
        # Lazy: a process the test failed to stop cannot keep the mount (or the machine's RAM).
        subprocess.run(["umount", "--lazy", str(path)], check=True)
