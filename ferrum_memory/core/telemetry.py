"""Tracing (OpenTelemetry), request ids and the request metrics.

`setup_tracing()` runs once in each serving process, after any fork: wsgi.py (so in each
gunicorn worker), the Celery worker's processes and beat (ferrum_memory/celery.py), manage.py.
With OTEL_EXPORTER_OTLP_ENDPOINT empty it does nothing: no provider, no instrumentation, and
our spans are skipped (see `_span`), so the hot paths pay nothing and nothing touches the
network.
"""

import contextlib
import functools
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from opentelemetry import trace
from opentelemetry.util.types import Attributes
from prometheus_client import Counter, Histogram

from . import logs
from .metrics import INDEX_LAG, api_request_seconds

if TYPE_CHECKING:  # the SDK loads only when tracing is on
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("ferrum_memory.access")

# Resolved through the global provider on each call: no-op until setup_tracing() sets one.
tracer = trace.get_tracer("ferrum_memory")

F = TypeVar("F", bound=Callable[..., Any])

_traced_pid: int | None = None
# Whether our own spans are made: set once by setup_tracing(), read by `_span`.
_tracing = False
# Even the no-op tracer's span context manager costs a few microseconds a call, which shows
# on the ~1 ms replay path; with tracing off `_span` hands out this shared no-op instead.
_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)
# The last lag each index reported, so a catch-up that changes nothing writes no metric.
_lags: dict[str, float] = {}


def _instrumentors() -> list[Any]:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    # httpx: qdrant-client's calls to a Qdrant server.
    return [
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        RedisInstrumentor(),
        PsycopgInstrumentor(),
        HTTPXClientInstrumentor(),
    ]


def setup_tracing(exporter: "SpanExporter | None" = None) -> bool:
    """Trace this process: to the OTLP collector at OTEL_EXPORTER_OTLP_ENDPOINT, or to
    `exporter` (tests). Returns whether tracing is on. Idempotent within a process.

    Call it after a fork: the batch processor's export thread does not survive one."""
    global _traced_pid, _tracing
    if _traced_pid == os.getpid():
        return True
    if exporter is None and not settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return False  # off: not even the SDK is imported
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is not None:
        processor: Any = SimpleSpanProcessor(exporter)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # The base endpoint, as the OTLP spec defines it; traces go to its /v1/traces.
        endpoint = settings.OTEL_EXPORTER_OTLP_ENDPOINT.rstrip("/") + "/v1/traces"
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))
    # The sampler follows OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.OTEL_SERVICE_NAME}))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    for instrumentor in _instrumentors():
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()
    _traced_pid = os.getpid()
    _tracing = True
    logger.info("tracing to %s", settings.OTEL_EXPORTER_OTLP_ENDPOINT or "a test exporter")
    return True


def teardown_tracing() -> None:
    """Undo the library instrumentation and stop our spans (tests: the provider, global and
    set once per process, stays)."""
    global _traced_pid, _tracing
    for instrumentor in _instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
    _traced_pid = None
    _tracing = False


def _span(name: str, attributes: Attributes = None) -> Any:
    if not _tracing:
        return _NO_SPAN
    return tracer.start_as_current_span(name, attributes=attributes)


def _set_lag(revision: str, lag: float) -> None:
    if _lags.get(revision) != lag:
        INDEX_LAG.labels(index=revision).set(lag)
        _lags[revision] = lag


def traced(
    name: str,
    attributes: Callable[..., Attributes] | None = None,
    *,
    result_count: Callable[[Any], int] | None = None,
    latency: Callable[..., Histogram] | None = None,
    done: Counter | None = None,
) -> Callable[[F], F]:
    """Run the function in a span `name`.

    `attributes(*args, **kwargs)` gives the span's attributes from the call (ids, sizes and
    modes: never memory content); it runs only when the span is recorded. `result_count(result)`
    is recorded as the span's `result_count`. `latency(*args, **kwargs)` picks a histogram to
    observe the duration of a call that returned in; `done` counts those calls."""

    def decorator(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            with _span(name) as span:
                recording = span.is_recording()
                if recording and attributes is not None:
                    span.set_attributes(attributes(*args, **kwargs) or {})
                result = function(*args, **kwargs)
                if recording and result_count is not None:
                    span.set_attribute("result_count", result_count(result))
            if latency is not None:
                latency(*args, **kwargs).observe(time.perf_counter() - started)
            if done is not None:
                done.inc()
            return result

        return wrapper  # type: ignore[return-value]

    return decorator


def index_catch_up(revision: str) -> Callable[[F], F]:
    """For an index's catch-up method (its object has a `cursor`): a span, and the index lag
    gauge: 0 after a catch-up, DB revision minus the cursor when one fails."""

    def decorator(function: F) -> F:
        attributes = {"index": revision}

        @functools.wraps(function)
        def wrapper(index: Any) -> Any:
            with _span("index.catch_up", attributes):
                try:
                    result = function(index)
                except BaseException:
                    _record_lag(revision, index)
                    raise
            _set_lag(revision, 0)
            return result

        return wrapper  # type: ignore[return-value]

    return decorator


def _record_lag(revision: str, index: Any) -> None:
    from .revisions import revision_state

    try:
        _set_lag(revision, revision_state(name=revision)[0] - index.cursor)
    except Exception:  # the DB or the index is down too: keep the last known lag
        # The caller reports the failure itself; this would repeat it on every request.
        logger.debug("could not measure the lag of the %s index", revision, exc_info=True)


# Requests --------------------------------------------------------------------------------------

# An incoming X-Request-ID is kept when it is a plain token (it goes into logs and headers).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:+/=-]{1,128}")


def _operation(request: HttpRequest) -> str:
    """The route that answered (bounded label values), e.g. "memory/<uuid:point_id>"."""
    match = request.resolver_match
    if match is None:
        return "unmatched"
    return "admin" if match.route.startswith("admin/") else match.route


@contextlib.contextmanager
def _request_id(request: HttpRequest) -> Iterator[str]:
    incoming = request.headers.get("X-Request-ID", "")
    value = incoming if _REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
    token = logs.request_id.set(value)
    try:
        yield value
    finally:
        logs.request_id.reset(token)


# A metric label takes a bounded set of values: any other verb a client sends is "OTHER".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _method_label(request: HttpRequest) -> str:
    return request.method if request.method in HTTP_METHODS else "OTHER"


def _level(status: int) -> int:
    """Errors and failed requests stand out, as in Django's own request log."""
    return logging.ERROR if status >= 500 else logging.WARNING if status >= 400 else logging.INFO


class RequestTelemetryMiddleware:
    """Per request: the request id (kept from X-Request-ID or made, returned in X-Request-ID),
    the latency histogram per operation, and one JSON access line carrying both ids."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with _request_id(request) as request_id:
            trace.get_current_span().set_attribute("request_id", request_id)
            started = time.perf_counter()
            response = self.get_response(request)
            seconds = time.perf_counter() - started
            operation = _operation(request)
            api_request_seconds(operation, _method_label(request), response.status_code).observe(
                seconds
            )
            access_logger.log(
                _level(response.status_code),
                "%s %s %s",
                request.method,
                request.path,
                response.status_code,
                extra={
                    "method": request.method,
                    "path": request.path,
                    "operation": operation,
                    "status": response.status_code,
                    "duration_ms": round(seconds * 1000, 3),
                },
            )
        response["X-Request-ID"] = request_id
        # Django would log a 4xx or 5xx answer again after this middleware returns, without the
        # ids ("Service Unavailable: /health"); the access line above says it with them.
        # (An exception's traceback is logged inside the middleware chain, with the ids.)
        response._has_been_logged = True  # type: ignore[attr-defined]
        return response
