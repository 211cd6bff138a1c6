"""The client's address, as the admin's login limits (django-axes) count it."""

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """REMOTE_ADDR, or behind ADMIN_LOGIN_TRUSTED_PROXIES proxies that each append the address
    they saw to X-Forwarded-For, the one the outermost proxy saw: the Nth entry from the right.
    Entries further left are the client's own claim, which anyone can forge, so they never
    count; a request with fewer entries did not come through the proxies and keeps its own."""
    proxies = settings.ADMIN_LOGIN_TRUSTED_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [address.strip() for address in forwarded.split(",") if address.strip()]
    if proxies and len(hops) >= proxies:
        return hops[-proxies]
    return request.META.get("REMOTE_ADDR")
