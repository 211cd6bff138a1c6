import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from .models import ApiKey
from .storage import is_disk_full

if TYPE_CHECKING:  # rest_framework.views imports the permission classes: no cycle at run time
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)

# A process adds its requests to the shared counter in batches of this share of the budget:
# at 6000/min, one cache write every 60 requests instead of three cache calls on each (a
# file cache's write is a temporary file and a rename: the throttle cost as much as the rest
# of a trivial request, bench/web.py). A budget under 100 is counted on every request.
SYNC_SHARE = 100


@dataclass
class _Window:
    """One key's window as this process sees it."""

    number: int
    shared: int = 0  # the shared counter at this process's last add
    pending: int = 0  # this process's requests not added to it yet


class ApiKeyRateThrottle(SimpleRateThrottle):
    """One request budget per API key (API_THROTTLE_RATE), shared by all its clients.

    A fixed window: one counter per key and window in the cache (atomic add and incr on Redis).
    Each process adds its requests to it in batches of up to 1% of the budget and counts
    the rest locally, so every process admits at most 1% of the budget beyond it that the
    others cannot see yet; a client may also spend up to twice its budget across a window
    boundary. DRF's sliding window kept every request's time in one cache entry, read and
    rewritten whole on each request."""

    scope = "api_key"
    window_end = 0.0
    _windows: ClassVar[dict[int, _Window]] = {}  # per key id, this process's view
    _windows_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def forget_windows(cls) -> None:
        """Drop this process's counts (tests: each starts with a fresh budget)."""
        with cls._windows_lock:
            cls._windows.clear()

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
        assert isinstance(request.auth, ApiKey)  # a key, since it has a cache key
        budget, duration = self.parse_rate(self.rate)
        assert budget is not None and duration is not None  # a rate was set
        self.now = self.timer()
        number = int(self.now // duration)
        self.window_end = (number + 1) * duration
        with self._windows_lock:
            window = self._windows.get(request.auth.pk)
            if window is None or window.number != number:
                window = self._windows[request.auth.pk] = _Window(number)
            window.pending += 1
            seen = window.shared + window.pending
            add = window.pending if window.pending >= max(1, budget // SYNC_SHARE) else 0
            window.pending -= add
        if add:  # outside the lock: the other threads need not wait for the cache
            shared = self._add(f"{key}:{number}", add, duration)
            with self._windows_lock:
                window.shared = max(window.shared, shared)
                seen = window.shared + window.pending
        return bool(seen <= budget)

    def _add(self, counter: str, count: int, duration: int) -> int:
        """Add `count` requests to the shared counter; its new value."""
        self.cache.add(counter, 0, duration + 1)
        try:
            return int(self.cache.incr(counter, count))
        except ValueError:  # expired between add and incr: these requests open the window
            self.cache.set(counter, count, duration + 1)
            return count

    def wait(self) -> float:
        """Seconds until the window ends (the Retry-After of a 429)."""
        return max(0.0, self.window_end - self.now)
