"""JSON logs: one object a line, each carrying the request id and the trace id.

Kept free of Django imports, so the settings and gunicorn.conf.py can use it before Django is
set up. The request id is set per request by telemetry.RequestTelemetryMiddleware and per task
by the Celery signal handlers in ferrum_memory/celery.py (a task inherits the id of the request
that enqueued it).
"""

import logging
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
task_id: ContextVar[str | None] = ContextVar("task_id", default=None)

# Every line has these keys, null when there is no request, task or trace.
FIELDS = ("asctime", "levelname", "name", "message", "request_id", "trace_id", "span_id", "task_id")


class LogContextFilter(logging.Filter):
    """Adds the ids of the current request, task and span to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.task_id = task_id.get()
        context = trace.get_current_span().get_span_context()
        # The hex forms every tracing backend shows; null when tracing is off.
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else None
        record.span_id = format(context.span_id, "016x") if context.is_valid else None
        return True


def logging_config(level: str) -> dict[str, Any]:
    """A dictConfig for JSON lines on stderr from every logger (Django, Celery, gunicorn)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": LogContextFilter}},
        "formatters": {
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": list(FIELDS),
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            }
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "filters": ["context"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
    }
