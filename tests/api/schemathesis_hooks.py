"""Loaded by the schemathesis CLI in tests/api/test_schemathesis.py (SCHEMATHESIS_HOOKS)."""

from typing import Any

import orjson
import schemathesis


@schemathesis.serializer("application/x-ndjson")
def json_lines(ctx: Any, value: Any) -> bytes:
    """An agent import's body (JSON Lines): a string as it is, anything else as JSON."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(value)


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    """POST /memory/context's two shares, when both are given, must add up to 1: a rule across
    fields that a JSON Schema cannot state (its description says it), so generated bodies keep
    to it. Bodies without both shares as numbers pass as they are."""
    operation = ctx.operation
    if operation is None or (operation.method.upper(), operation.path) != (
        "POST",
        "/memory/context",
    ):
        return True
    if not isinstance(body, dict):
        return True
    shares = [body.get("recent_share"), body.get("memory_share")]
    numbers = [float(v) for v in shares if isinstance(v, int | float) and not isinstance(v, bool)]
    return len(numbers) < 2 or abs(sum(numbers) - 1) <= 1e-9
