"""One exception type per class of failure, each carrying what the service said."""

from __future__ import annotations

from typing import Any

import httpx


class FerrumError(Exception):
    """Base of every error this client raises."""


class APIConnectionError(FerrumError):
    """No answer from the service: it could not be reached, or the connection broke."""


class APIStatusError(FerrumError):
    """The service answered with an error status.

    `status` is the HTTP status, `message` the service's `detail` (or a summary of the field
    errors), `field_errors` maps each rejected field to its messages (a 400 names them; nested
    fields are dotted: `test_result.passed`, `tool_calls.0.name`), and `body` is the whole answer.
    """

    status: int = 0

    def __init__(
        self, message: str, *, status: int, field_errors: dict[str, list[str]], body: Any
    ) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.field_errors = field_errors
        self.body = body


class BadRequestError(APIStatusError):
    status = 400


class AuthenticationError(APIStatusError):
    status = 401


class PermissionDeniedError(APIStatusError):
    status = 403


class NotFoundError(APIStatusError):
    status = 404


class ConflictError(APIStatusError):
    """409: a stale session version (`body["current_version"]`), a lost dream-cycle lease, an id
    another agent uses, or a buffer smaller than `min_size`."""

    status = 409


class GoneError(APIStatusError):
    """410: the session is closed or expired."""

    status = 410


class RateLimitError(APIStatusError):
    status = 429


class ServiceUnavailableError(APIStatusError):
    """503: a backend the call needs is down (the message names it)."""

    status = 503


class InternalServerError(APIStatusError):
    pass


_BY_STATUS: dict[int, type[APIStatusError]] = {
    cls.status: cls
    for cls in (
        BadRequestError,
        AuthenticationError,
        PermissionDeniedError,
        NotFoundError,
        ConflictError,
        GoneError,
        RateLimitError,
        ServiceUnavailableError,
    )
}


def _flatten(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error bodies as {dotted.field: [messages]}."""
    if isinstance(errors, dict):
        out: dict[str, list[str]] = {}
        for key, value in errors.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(errors, list) and errors and all(isinstance(e, str) for e in errors):
        return {prefix or "non_field_errors": list(errors)}
    if isinstance(errors, list):
        out = {}
        for index, value in enumerate(errors):
            if value:  # DRF puts {} for the valid items of a list
                out.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix or "non_field_errors": [str(errors)]}


def error_from_response(response: httpx.Response) -> APIStatusError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    message, field_errors = "", {}
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        message = body["detail"]
    elif isinstance(body, dict | list):
        field_errors = _flatten(body)
        message = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in field_errors.items())
    else:
        message = str(body) or response.reason_phrase
    code = response.status_code
    cls = _BY_STATUS.get(code) or (InternalServerError if code >= 500 else APIStatusError)
    return cls(message, status=code, field_errors=field_errors, body=body)
