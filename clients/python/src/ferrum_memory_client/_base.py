"""How an operation is declared once and served by both the sync and the async client.

An operation is a builder function (its keyword arguments are the method's signature) that turns
arguments into a `Call`: path values, query, body and how to read the answer. `operation(...)`
makes it a descriptor: on a `Client` it is a method returning the result, on an `AsyncClient`
the same method returning an awaitable. Sending, retrying and error mapping live in the two
transports below, once each.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, Self, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from ._retry import RetryPolicy
from .errors import APIConnectionError, error_from_response

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Call(Generic[R]):
    """One request, before the method and path of its operation are known."""

    read: Callable[[httpx.Response], R]
    path: Mapping[str, Any] = field(default_factory=dict)
    query: Mapping[str, Any] | None = None
    body: Any = None


def parsed(model: Any) -> Callable[[httpx.Response], Any]:
    """Read a JSON answer as `model` (a pydantic model or any type pydantic validates)."""
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    return lambda response: adapter.validate_json(response.content)


def nothing(response: httpx.Response) -> None:
    return None


def present(**fields: Any) -> dict[str, Any]:
    """The arguments that were given (None means: leave it to the service's default), as JSON."""
    return {k: to_jsonable_python(v, exclude_none=True) for k, v in fields.items() if v is not None}


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    idempotent: bool
    params: dict[str, Any] | None
    json: Any


class Operation(Generic[P, R]):
    def __init__(
        self, method: str, path: str, build: Callable[P, Call[R]], *, idempotent: bool
    ) -> None:
        self.method, self.path, self.build, self.idempotent = method, path, build, idempotent
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__

    def request(self, *args: P.args, **kwargs: P.kwargs) -> tuple[Request, Call[R]]:
        call = self.build(*args, **kwargs)
        url = self.path.format(**{k: quote(str(v), safe="") for k, v in call.path.items()})
        params = None
        if call.query is not None:
            params = {
                k: str(v).lower() if isinstance(v, bool) else v
                for k, v in call.query.items()
                if v is not None
            }
        return Request(self.method, url, self.idempotent, params, call.body), call

    @overload
    def __get__(self, obj: None, owner: type) -> Operation[P, R]: ...
    @overload
    def __get__(self, obj: SyncTransport, owner: type) -> Callable[P, R]: ...
    @overload
    def __get__(self, obj: AsyncTransport, owner: type) -> Callable[P, Awaitable[R]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self

        def method(*args: Any, **kwargs: Any) -> Any:
            request, call = self.request(*args, **kwargs)
            return obj._send(request, call.read)

        method.__name__ = self.__name__
        method.__doc__ = self.__doc__
        return method


def operation(
    method: str, path: str, *, idempotent: bool
) -> Callable[[Callable[P, Call[R]]], Operation[P, R]]:
    """Declare an operation of /openapi.json: `idempotent` says a retry cannot do it twice."""

    def declare(build: Callable[P, Call[R]]) -> Operation[P, R]:
        return Operation(method, path, build, idempotent=idempotent)

    return declare


class _Transport:
    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.api_key = api_key if api_key is not None else os.environ.get("FERRUM_API_KEY")
        self.base_url = (base_url or os.environ.get("FERRUM_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "ferrum-memory-client/0.1"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _outcome(self, request: Request, attempt: int, response: Any, error: Any) -> float | None:
        """Seconds to wait before sending again, or None when this outcome is final."""
        if attempt >= self.retry.max_retries:
            return None
        if not self.retry.should_retry(
            idempotent=request.idempotent, response=response, error=error
        ):
            return None
        return self.retry.delay(attempt, response)


def _final(
    request: Request,
    response: httpx.Response | None,
    error: Exception | None,
    read: Callable[[httpx.Response], T],
) -> T:
    """The call's result, or the exception that says why there is none."""
    if response is None:
        raise APIConnectionError(f"{request.method} {request.url}: {error!r}") from error
    if response.is_error:
        raise error_from_response(response)
    return read(response)


class SyncTransport(_Transport):
    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(api_key, base_url, timeout=timeout, retry=retry)
        self._http = http_client or httpx.Client(timeout=timeout)
        self._owns_http = http_client is None

    def _send(self, request: Request, read: Callable[[httpx.Response], T]) -> T:
        attempt = 0
        while True:
            response, error = None, None
            try:
                response = self._http.request(
                    request.method,
                    self.base_url + request.url,
                    params=request.params,
                    json=request.json,
                    headers=self._headers(),
                )
            except httpx.TransportError as exc:
                error = exc
            wait = self._outcome(request, attempt, response, error)
            if wait is None:
                return _final(request, response, error, read)
            time.sleep(wait)
            attempt += 1

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTransport(_Transport):
    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(api_key, base_url, timeout=timeout, retry=retry)
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._owns_http = http_client is None

    async def _send(self, request: Request, read: Callable[[httpx.Response], T]) -> T:
        attempt = 0
        while True:
            response, error = None, None
            try:
                response = await self._http.request(
                    request.method,
                    self.base_url + request.url,
                    params=request.params,
                    json=request.json,
                    headers=self._headers(),
                )
            except httpx.TransportError as exc:
                error = exc
            wait = self._outcome(request, attempt, response, error)
            if wait is None:
                return _final(request, response, error, read)
            await asyncio.sleep(wait)
            attempt += 1

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
