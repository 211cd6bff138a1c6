"""Django's browser middleware, run for the admin's paths only.

The API authenticates every request by its key and reads no cookie, so sessions, the
logged-in user and messages only cost it time (bench/web.py). Each class here is Django's
own, skipped outside /admin/; being subclasses, the admin's system checks still find them.
CSRF stays in MIDDLEWARE as it is: the API's views are exempt, and the deploy check looks
for Django's own class by name.
"""

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse

ADMIN_PREFIX = "/admin/"


class AdminPathsOnly:
    """A mixin for a MiddlewareMixin middleware: outside /admin/, hand the request on as is."""

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(ADMIN_PREFIX):
            return self.get_response(request)  # type: ignore[attr-defined]
        return super().__call__(request)  # type: ignore[misc]


class AdminSessionMiddleware(AdminPathsOnly, SessionMiddleware):
    pass


class AdminAuthenticationMiddleware(AdminPathsOnly, AuthenticationMiddleware):
    pass


class AdminMessageMiddleware(AdminPathsOnly, MessageMiddleware):
    pass
