"""Loaded by the schemathesis CLI in tests/api/test_schemathesis.py (SCHEMATHESIS_HOOKS)."""

from typing import Any

import orjson
import schemathesis


@schemathesis.serializer("application/x-ndjson")
def json_lines(ctx: Any, value: Any) -> bytes:
    """An agent import's body (JSON Lines): a string as it is, anything else as JSON."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(value)
