"""Python SDK for the ferrum-memory service: `Client`, `AsyncClient`, their errors and results."""

from ._retry import RetryPolicy
from .client import AsyncClient, Client, Operations, cursor_of, new_experience_id
from .errors import (
    APIConnectionError,
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    FerrumError,
    GoneError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
)

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "FerrumError",
    "GoneError",
    "InternalServerError",
    "NotFoundError",
    "Operations",
    "PermissionDeniedError",
    "RateLimitError",
    "RetryPolicy",
    "ServiceUnavailableError",
    "cursor_of",
    "new_experience_id",
]
