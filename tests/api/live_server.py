"""The service as it is deployed: gunicorn on a free port, embedded defaults, a temp data dir."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The scaled-out run's variables: unset, so the server runs on the embedded defaults.
SCALED_OUT = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "QDRANT_URL")


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    api_key: str
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def manage(self, *args: str) -> str:
        """Run a management command on the server's database (e.g. `dream --agent ID`)."""
        return _manage(self.env, *args)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return result.stdout.strip()


def live_server(data_dir: Path, /, **extra_env: str) -> AbstractContextManager[LiveServer]:
    return live_server_of(ROOT, data_dir, **extra_env)


@contextmanager
def live_server_of(root: Path, data_dir: Path, /, **extra_env: str) -> Iterator[LiveServer]:
    """gunicorn as deployed, with the code of the checkout at `root` (bench/web.py
    --baseline runs another checkout's beside this one, on the same data)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in SCALED_OUT}
    env.update(
        DJANGO_SETTINGS_MODULE="ferrum_memory.settings.base",
        FERRUM_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
        GUNICORN_BIND=f"127.0.0.1:{port}",
        **extra_env,
    )
    _manage(env, "migrate", "--noinput")
    api_key = _manage(env, "create_api_key", "live-server").splitlines()[-1]
    log = (data_dir / "gunicorn.log").open("a")  # two servers may share the folder
    server = subprocess.Popen(
        [str(BIN / "gunicorn"), "ferrum_memory.wsgi:application", "--config", "gunicorn.conf.py"],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        # Waiting for a process to come up is a loop with a deadline, not a timed assertion.
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {server.returncode}; see {log.name}")
            try:
                requests.get(f"{base_url}/openapi.json", timeout=5).raise_for_status()
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield LiveServer(base_url=base_url, api_key=api_key, env=env)
    finally:
        server.terminate()  # SIGTERM: gunicorn's graceful shutdown
        server.wait(timeout=60)
        log.close()
