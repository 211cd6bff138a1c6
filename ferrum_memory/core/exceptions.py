"""Domain errors and how the API shows them: JSON always, never an HTML error page."""

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


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


class Unavailable(ServiceError):
    """A backend the request needs is down: the client may retry later."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        return Response({"detail": exc.message, **exc.extra}, status=exc.status_code)
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
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return JsonResponse(
            {"detail": f"The request body is larger than {limit} bytes."}, status=400
        )
    return JsonResponse({"detail": "Bad request."}, status=400)


def json_permission_denied(
    request: HttpRequest, exception: Exception | None = None
) -> JsonResponse:
    return JsonResponse({"detail": "Permission denied."}, status=403)
