import logging
from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from .models import ApiKey

if TYPE_CHECKING:  # rest_framework.views imports the permission classes: no cycle at run time
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)


class ApiKeyRateThrottle(SimpleRateThrottle):
    """One request budget per API key (API_THROTTLE_RATE), shared by all its clients."""

    scope = "api_key"

    def get_cache_key(self, request: Request, view: "APIView") -> str | None:
        if not isinstance(request.auth, ApiKey):
            return None  # public endpoints are not throttled per key
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}

    def allow_request(self, request: Request, view: "APIView") -> bool:
        # Scaled out, the counters live in Redis (Django's RedisCache raises redis-py's errors).
        # Redis being down must cost only the sessions (DESIGN.md), so the budget goes
        # unchecked until it is back rather than every request failing.
        try:
            return super().allow_request(request, view)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            logger.warning("API throttling skipped, its cache does not answer: %s", exc)
            return True
