import logging
from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from .models import ApiKey
from .storage import is_disk_full

if TYPE_CHECKING:  # rest_framework.views imports the permission classes: no cycle at run time
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)


class ApiKeyRateThrottle(SimpleRateThrottle):
    """One request budget per API key (API_THROTTLE_RATE), shared by all its clients.

    A fixed window: one counter per key and window, added then incremented (atomic on Redis).
    DRF's sliding window keeps every request's time in one cache entry, read and rewritten
    whole on each request: at 6000/min that list was the throttle's cost (bench/http.py). A
    client may spend up to twice its budget across a window boundary, never more."""

    scope = "api_key"
    window_end = 0.0

    def get_cache_key(self, request: Request, view: "APIView") -> str | None:
        if not isinstance(request.auth, ApiKey):
            return None  # public endpoints are not throttled per key
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}

    def allow_request(self, request: Request, view: "APIView") -> bool:
        # Scaled out, the counters live in Redis (Django's RedisCache raises redis-py's errors).
        # Redis being down must cost only the sessions (DESIGN.md), so the budget goes
        # unchecked until it is back rather than every request failing.
        try:
            return self._allow(request, view)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            logger.warning("API throttling skipped, its cache does not answer: %s", exc)
            return True
        except OSError as exc:
            # Embedded, the counters are files in the data folder: on a full disk, reads must
            # still be served (tests/faults/test_disk_full.py), so the budget goes unchecked.
            if not is_disk_full(exc):
                raise
            logger.warning("API throttling skipped, its file cache cannot write: %s", exc)
            return True

    def _allow(self, request: Request, view: "APIView") -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        budget, duration = self.parse_rate(self.rate)
        assert budget is not None and duration is not None  # a rate was set
        self.now = self.timer()
        window = int(self.now // duration)
        self.window_end = (window + 1) * duration
        counter = f"{key}:{window}"
        self.cache.add(counter, 0, duration + 1)
        try:
            count = self.cache.incr(counter)
        except ValueError:  # expired between add and incr: this request opens the window
            self.cache.set(counter, 1, duration + 1)
            count = 1
        return bool(count <= budget)

    def wait(self) -> float:
        """Seconds until the window ends (the Retry-After of a 429)."""
        return max(0.0, self.window_end - self.now)
