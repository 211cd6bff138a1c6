"""Production settings: the base settings with HTTPS-only cookies and headers.

Use behind a TLS-terminating proxy: DJANGO_SETTINGS_MODULE=ferrum_memory.settings.production.
"""

from .base import *  # noqa: F403
from .base import env

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
# /health must answer plain HTTP probes from the orchestrator.
SECURE_REDIRECT_EXEMPT = [r"^health$"]
