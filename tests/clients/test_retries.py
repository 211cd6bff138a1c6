"""Retries: only where repeating a call cannot do it twice, with backoff, jitter and Retry-After.

Faults come from a real TCP proxy in front of the live service (tests/clients/proxy.py): it drops
an answer after the service did the work, or answers 503 itself. 429 comes from the service's
own throttle, on a server started with a budget of two requests a second.
"""

import asyncio
import random
import socket
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from ferrum_memory_client import (
    APIConnectionError,
    AsyncClient,
    Client,
    RetryPolicy,
    ServiceUnavailableError,
)

from ..api.live_server import live_server
from .conftest import FAST_RETRY
from .proxy import fault_proxy

pytestmark = pytest.mark.live_server


@pytest.fixture
def proxy(server):
    with fault_proxy(server.base_url) as faulty:
        yield faulty


@pytest.fixture
def proxied(server, proxy):
    with Client(server.api_key, proxy.url, retry=FAST_RETRY) as ferrum:
        yield ferrum


def _experience(agent_id: str) -> dict:
    return {"agent_id": agent_id, "task": "t", "reward": 1.0, "test_result": {"passed": True}}


def test_an_experience_whose_answer_was_dropped_is_sent_again_and_stored_once(
    proxied, proxy, client, agent_id
):
    proxy.faults.extend(["drop"])
    stored = proxied.experience_record(**_experience(agent_id))
    assert proxy.requests_to("POST", "/experience/") == ["drop", "pass"]
    assert [e.id for e in client.experience_list(agent_id=agent_id).results] == [stored.id]

    proxy.faults.extend(["drop", "drop"])
    batch = proxied.experience_record_many(items=[_experience(agent_id) for _ in range(3)])
    assert proxy.requests_to("POST", "/experience/")[2:] == ["drop", "drop", "pass"]
    assert (batch.created, batch.existing) == (0, 3)  # the dropped first try stored them
    assert len(client.experience_list(agent_id=agent_id).results) == 4


def test_a_memory_whose_answer_was_dropped_is_merged_into_itself(proxied, proxy, agent_id):
    proxy.faults.append("drop")
    stored = proxied.memory_store(agent_id=agent_id, content="Retries must not store twice.")
    assert proxy.requests_to("POST", "/memory/store") == ["drop", "pass"]
    assert stored.duplicate == "exact"  # the first try stored it; the retry found it
    hits = proxied.memory_search(agent_id=agent_id, query="retries store twice").results
    assert [hit.item.point_id for hit in hits] == [stored.point_id]


def test_a_call_that_could_act_twice_is_not_sent_again_after_a_drop(proxied, proxy, agent_id):
    proxy.faults.append("drop")
    with pytest.raises(APIConnectionError):
        proxied.session_start(agent_id=agent_id)
    assert proxy.requests_to("POST", "/session/start") == ["drop"]


def test_503_is_retried_on_a_read_until_it_answers(proxied, proxy):
    proxy.faults.extend(["503", "503"])
    assert proxied.health().status == "ok"
    assert proxy.requests_to("GET", "/health") == ["503", "503", "pass"]


def test_503_after_the_last_retry_raises_with_the_services_message(proxied, proxy):
    proxy.faults.extend(["503"] * 4)
    with pytest.raises(ServiceUnavailableError) as unavailable:
        proxied.stats()
    assert (unavailable.value.status, unavailable.value.message) == (503, "injected by proxy")
    assert proxy.requests_to("GET", "/stats") == ["503"] * 4  # 1 + max_retries


def test_503_is_not_retried_on_a_call_that_could_act_twice(proxied, proxy, agent_id):
    proxy.faults.append("503")
    with pytest.raises(ServiceUnavailableError):
        proxied.dream_cycle_claim(agent_id=agent_id)
    assert proxy.requests_to("POST", "/dream/cycles/claim") == ["503"]


def test_a_connection_that_never_opened_is_retried_for_any_call():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens once the socket is closed
    attempts: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [attempts.append]})
    with Client("key", f"http://127.0.0.1:{closed}", retry=FAST_RETRY, http_client=http) as ferrum:
        with pytest.raises(APIConnectionError) as refused:
            ferrum.session_start(agent_id="a")  # never sent, so safe to send again
    assert len(attempts) == 4
    assert isinstance(refused.value.__cause__, httpx.ConnectError)
    http.close()


def test_the_async_client_retries_the_same_way(server, proxy, client, agent_id):
    async def scenario() -> str:
        async with AsyncClient(server.api_key, proxy.url, retry=FAST_RETRY) as ferrum:
            proxy.faults.extend(["503", "drop"])
            stored = await ferrum.experience_record(**_experience(agent_id))
            proxy.faults.append("drop")
            with pytest.raises(APIConnectionError):
                await ferrum.session_start(agent_id=agent_id)
            return stored.id

    stored_id = asyncio.run(scenario())
    assert proxy.requests_to("POST", "/experience/") == ["503", "drop", "pass"]
    assert [e.id for e in client.experience_list(agent_id=agent_id).results] == [stored_id]


@dataclass(frozen=True)
class RecordingPolicy(RetryPolicy):
    waits: list[tuple[float, str | None]] = field(default_factory=list, compare=False)

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        wait = super().delay(attempt, response)
        self.waits.append((wait, response.headers.get("Retry-After") if response else None))
        return wait


def test_429_from_the_throttle_is_retried_after_retry_after(tmp_path):
    policy = RecordingPolicy(max_retries=5, backoff=0.05)
    statuses = []
    http = httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]})
    with live_server(tmp_path, API_THROTTLE_RATE="2/s") as throttled:
        ferrum = Client(throttled.api_key, throttled.base_url, retry=policy, http_client=http)
        with ferrum:
            for _ in range(6):
                ferrum.experience_stats()  # a read; a 429 would be retried on a write as well
    http.close()
    assert statuses.count(200) == 6
    assert statuses.count(429) >= 1
    assert len(policy.waits) == statuses.count(429)
    for wait, retry_after in policy.waits:
        assert retry_after is not None
        assert float(retry_after) <= wait <= float(retry_after) + policy.backoff


def test_backoff_is_exponential_with_full_jitter():
    policy = RetryPolicy(backoff=0.5, max_backoff=8.0, rng=random.Random(1))
    for attempt, ceiling in [(0, 0.5), (2, 2.0), (6, 8.0)]:
        waits = [policy.delay(attempt, None) for _ in range(4000)]
        assert 0 <= min(waits) and max(waits) <= ceiling
        # Uniform on [0, ceiling]: mean ceiling/2, sd ceiling/sqrt(12); 5 standard errors.
        assert abs(statistics.fmean(waits) - ceiling / 2) < 5 * ceiling / (12 * 4000) ** 0.5
        assert max(waits) > 0.95 * ceiling  # the whole range is used, not a fixed step


def test_retry_after_may_be_a_date_and_is_capped():
    policy = RetryPolicy(backoff=0.0, max_retry_after=30.0)
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    assert 18 <= policy.delay(0, httpx.Response(429, headers={"Retry-After": later})) <= 20
    assert policy.delay(0, httpx.Response(429, headers={"Retry-After": "3600"})) == 30.0
    assert policy.delay(0, httpx.Response(429, headers={"Retry-After": "soon"})) == 0.0
