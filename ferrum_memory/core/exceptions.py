"""Domain errors and how the API shows them: JSON always, never an HTML error page."""

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import OperationalError, connection
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from .parsers import body_too_large
from .storage import is_disk_full

logger = logging.getLogger(__name__)

DATABASE_FAILED = "The database did not answer this request (connection lost or busy); retry it."
DISK_FULL = (
    "The server's storage is full: writes are refused until space is freed, reads still work, "
    "and nothing already acknowledged is lost. Retry the write later."
)


class ServiceError(Exception):
    """Raised by services and selectors; the API answers it with `status_code` and the message."""

    status_code: int = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra


class NotFound(ServiceError):
    status_code = status.HTTP_404_NOT_FOUND


class Conflict(ServiceError):
    status_code = status.HTTP_409_CONFLICT


class Gone(ServiceError):
    status_code = status.HTTP_410_GONE


class TooManyRequests(ServiceError):
    """Not now: the client may retry after `retry_after` seconds (the Retry-After header)."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS

    def __init__(self, message: str, *, retry_after: int, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after = retry_after


class Unavailable(ServiceError):
    """A backend the request needs is down: the client may retry later."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE


class StorageFull(ServiceError):
    """No space left where the data lives: 507 Insufficient Storage (RFC 4918), retry later."""

    status_code = status.HTTP_507_INSUFFICIENT_STORAGE


def _transient(exc: OperationalError) -> bool:
    """On PostgreSQL an OperationalError is the connection or the server; SQLite also raises it
    for bugs ("no such table"), which must stay 500s: there only a busy database is transient."""
    return connection.vendor != "sqlite" or "locked" in str(exc)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if not isinstance(exc, ServiceError) and is_disk_full(exc):
        logger.warning("storage full, write refused with 507: %s", exc)
        exc = StorageFull(DISK_FULL)
    if isinstance(exc, ServiceError):
        headers = (
            {"Retry-After": str(exc.retry_after)} if isinstance(exc, TooManyRequests) else None
        )
        return Response(
            {"detail": exc.message, **exc.extra}, status=exc.status_code, headers=headers
        )
    if isinstance(exc, OperationalError) and _transient(exc):
        # A dropped connection, a restarted server, a lock wait that timed out: transient, so
        # 503 (retry), not 500. Django closes the broken connection as the request ends and
        # the next request opens a new one.
        logger.warning("database error, answered 503: %s", exc, exc_info=True)
        return Response({"detail": DATABASE_FAILED}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            detail=exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        )
    return exception_handler(exc, context)


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse({"detail": "Not found."}, status=404)


def json_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"detail": "Internal server error."}, status=500)


def json_bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    if isinstance(exception, RequestDataTooBig):  # a middleware read the body before DRF did
        return JsonResponse({"detail": body_too_large()}, status=400)
    return JsonResponse({"detail": "Bad request."}, status=400)


def json_permission_denied(
    request: HttpRequest, exception: Exception | None = None
) -> JsonResponse:
    return JsonResponse({"detail": "Permission denied."}, status=403)
