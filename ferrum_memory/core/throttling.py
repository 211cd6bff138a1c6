from typing import TYPE_CHECKING

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from .models import ApiKey

if TYPE_CHECKING:  # rest_framework.views imports the permission classes: no cycle at run time
    from rest_framework.views import APIView


class ApiKeyRateThrottle(SimpleRateThrottle):
    """One request budget per API key (API_THROTTLE_RATE), shared by all its clients."""

    scope = "api_key"

    def get_cache_key(self, request: Request, view: "APIView") -> str | None:
        if not isinstance(request.auth, ApiKey):
            return None  # public endpoints are not throttled per key
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}
