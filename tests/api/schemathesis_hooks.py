"""Loaded by the schemathesis CLI in tests/api/test_schemathesis.py (SCHEMATHESIS_HOOKS)."""

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def json_lines(ctx: Any, value: Any) -> bytes:
    """An agent import's body (JSON Lines): a string as it is, anything else as JSON. The
    standard library's json, as a generated value may hold an integer beyond 64 bits, which
    orjson cannot write (a run failed on it)."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return json.dumps(value).encode()


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


# The agent whose rows the config hands operations as known ids (test_schemathesis.known_ids).
# The run learns its name from the listings and once erased it before POST /session/close and
# POST /dream/cycles/{cycle_id}/td-errors were fuzzed: their every later case answered 404, a
# "missing test data" warning that fails the run (3 runs of 7 tried). Its erasure goes to an
# agent of no rows instead; erasing is checked on every other agent the run makes up, and in
# tests/agents.
FIXTURES_AGENT = "dreamer"


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    """DELETE /agents/{FIXTURES_AGENT} erases another agent: the fixtures stay for the run."""
    if (
        case.method.upper() == "DELETE"
        and case.path == "/agents/{agent_id}"
        and case.path_parameters.get("agent_id") == FIXTURES_AGENT
    ):
        case.path_parameters["agent_id"] = f"{FIXTURES_AGENT}-stand-in"
