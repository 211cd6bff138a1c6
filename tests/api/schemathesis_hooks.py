"""Loaded by the schemathesis CLI in tests/api/test_schemathesis.py (SCHEMATHESIS_HOOKS)."""

from typing import Any

import orjson
import schemathesis


@schemathesis.serializer("application/x-ndjson")
def json_lines(ctx: Any, value: Any) -> bytes:
    """An agent import's body (JSON Lines): a string as it is, anything else as JSON."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(value)


# A generated ttl of a few seconds can run out between a store and the request the schema's
# links chain after it (a DELETE answering 404 for an item already expired, which schemathesis
# reads as a resource gone too soon): seen on a loaded machine. Short ttls are tested where
# their expiry is the point (tests/experience, tests/memory, tests/sessions).
LASTING_SECONDS = 3600


@schemathesis.hook("map_body")
def lasting_ttls(ctx: Any, body: Any) -> Any:
    """Lengthen each valid ttl_seconds shorter than an hour by an hour; invalid ones (negative,
    not an integer) stay as generated, so negative cases are still refused."""
    for item in body if isinstance(body, list) else [body]:
        ttl = item.get("ttl_seconds") if isinstance(item, dict) else None
        if type(ttl) is int and 0 < ttl < LASTING_SECONDS:
            item["ttl_seconds"] = ttl + LASTING_SECONDS
    return body
