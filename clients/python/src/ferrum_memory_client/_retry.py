"""When a failed call is sent again, and after how long: the only place that decides it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

# The request never reached the service: sending it again cannot do anything twice.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (the n-th wait is uniform in
    [0, min(max_backoff, backoff * 2**n)]), or the service's Retry-After plus a jitter of up to
    `backoff`, whichever the answer asks for. `max_retries=0` turns retries off.

    What is retried:
    - 429 on any call: the throttle refuses a request before it runs;
    - a connection that could not be opened, on any call: the request was never sent;
    - 503 and a connection lost after sending, only on calls that are safe to repeat (reads, and
      writes made idempotent: experiences carry an id the client sets, exact-duplicate memories
      are merged, closing or compressing a session again answers the same consolidation).
    """

    max_retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def should_retry(
        self, *, idempotent: bool, response: httpx.Response | None, error: Exception | None
    ) -> bool:
        if response is not None:
            return response.status_code == 429 or (idempotent and response.status_code == 503)
        if isinstance(error, NOT_SENT):
            return True
        return idempotent and isinstance(error, httpx.TransportError)

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds to wait before retry number `attempt` (from 0)."""
        retry_after = _retry_after(response)
        if retry_after is not None:
            return min(retry_after, self.max_retry_after) + self.rng.uniform(0, self.backoff)
        return self.rng.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))


def _retry_after(response: httpx.Response | None) -> float | None:
    value = response.headers.get("Retry-After") if response is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())
