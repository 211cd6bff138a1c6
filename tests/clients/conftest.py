"""The client package's tests run against the service as deployed (gunicorn, embedded defaults),
started once for all of them, like the schemathesis test."""

from collections.abc import Iterator

import pytest
from ferrum_memory_client import Client, RetryPolicy

from ..api.live_server import LiveServer, live_server

# Small dream cycles, so that a test's few experiences are enough for one.
DREAM_ENV = {"DREAM_MIN_EXPERIENCES": "4", "DREAM_BATCH_SIZE": "8"}
# Short waits: the tests retry many times, and what is tested is whether they retry.
FAST_RETRY = RetryPolicy(max_retries=3, backoff=0.05, max_backoff=0.2)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[LiveServer]:
    with live_server(
        tmp_path_factory.mktemp("clients"), API_THROTTLE_RATE="1000000/min", **DREAM_ENV
    ) as live:
        yield live


@pytest.fixture
def client(server) -> Iterator[Client]:
    with Client(server.api_key, server.base_url, retry=FAST_RETRY) as ferrum:
        yield ferrum


@pytest.fixture
def agent_id(request) -> str:
    """An agent of the test's own, so that tests on the one server never see each other's data."""
    return f"agent-{request.node.name}"[:200]
