"""Property-based API test: every operation of /openapi.json, as the running service serves it.

schemathesis generates requests from the schema, valid and invalid ones, and checks each answer:
never a 5xx, a status code and content type the schema documents, a body that matches its schema,
invalid input refused. Hypothesis runs derandomized, so a failure reproduces on the next run.

It needs only the embedded defaults, which the server uses in either run of scripts/test.sh, so
the scaled-out run deselects it (-m "not live_server") instead of testing the same thing twice.
"""

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .live_server import LiveServer, live_server

EXAMPLES_PER_OPERATION = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "200"))
HTTP_METHODS = {"get", "put", "post", "patch", "delete"}

pytestmark = pytest.mark.live_server


def schema_operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation, read from the schema the server will serve: the test
    ids name the operations, and a new endpoint gets its test without anyone adding it here."""
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return [
        (method.upper(), path)
        for path, item in paths.items()
        for method in item
        if method in HTTP_METHODS
    ]


@schemathesis.serializer("application/x-ndjson")
def _json_lines(ctx: Any, value: Any) -> bytes:
    """An agent import's body (JSON Lines), which the schema gives as a string."""
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", errors="surrogatepass")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LiveServer]:
    # The throttle would answer 429 to this many requests a minute; it is tested elsewhere.
    with live_server(tmp_path_factory.mktemp("live"), API_THROTTLE_RATE="1000000/min") as live:
        yield live


@pytest.fixture(scope="module")
def api_schema(server):
    # The key goes through the schema's security scheme, not a session header: a negative case
    # that leaves it out must reach the server without it.
    config = schemathesis.Config.from_dict(
        {"auth": {"openapi": {"ApiKey": {"bearer": server.api_key}}}}
    )
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json", config=config)


def test_the_served_schema_has_the_operations_tested_here(api_schema):
    served = {
        (operation.method.upper(), operation.path)
        for operation in (result.ok() for result in api_schema.get_all_operations())
    }
    assert served == set(schema_operations())


def _instant(value: object) -> datetime:
    moment = datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # as DRF reads it (USE_TZ)


def _ordered_range(case: schemathesis.Case) -> bool:
    body = case.body if isinstance(case.body, dict) else (case.query or {})
    try:
        return _instant(body["created_after"]) <= _instant(body["created_before"])
    except (KeyError, ValueError):
        return True


def _unique_ids(case: schemathesis.Case) -> bool:
    if not isinstance(case.body, list):
        return True
    ids = [item.get("id") for item in case.body if isinstance(item, dict) and item.get("id")]
    return len(ids) == len(set(ids))


def _shares_add_up(case: schemathesis.Case) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    recent, memory = body.get("recent_share"), body.get("memory_share")
    if not isinstance(recent, int | float) or not isinstance(memory, int | float):
        return True
    return abs(recent + memory - 1) <= 1e-9


# Rules across fields, which a JSON Schema cannot state: valid cases keep to them.
CROSS_FIELD_RULES = {
    ("POST", "/memory/search"): _ordered_range,
    ("POST", "/memory/context"): _shares_add_up,
    ("GET", "/memory/"): _ordered_range,
    ("POST", "/experience/"): _unique_ids,
}


# A JSON Lines import is a string to a JSON Schema; what makes it an export (a header, typed
# lines, an end line that counts them) is beyond one, so a generated "valid" string is not an
# export. Only invalid bodies are generated here; tests/agents/test_transfer.py imports real ones.
NEGATIVE_ONLY = {("POST", "/agents/{agent_id}/import")}


def _nul_free(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "0")
    if isinstance(value, list):
        return [_nul_free(v) for v in value]
    if isinstance(value, dict):
        return {_nul_free(k): _nul_free(v) for k, v in value.items()}
    return value


def _without_nul(case: schemathesis.Case) -> schemathesis.Case:
    """No JSON string may hold a NUL (the API description says so; PostgreSQL cannot store it):
    a typed field's schema excludes it, free-form JSON cannot, so valid cases leave it out."""
    case.body = _nul_free(case.body)
    return case


@pytest.mark.parametrize(("method", "path"), schema_operations())
def test_operation_conforms_to_its_schema(api_schema, method, path):
    operation = api_schema[path][method]
    rule = CROSS_FIELD_RULES.get((method, path), lambda case: True)
    negative = operation.as_strategy(schemathesis.GenerationMode.NEGATIVE)
    positive = operation.as_strategy(schemathesis.GenerationMode.POSITIVE)
    cases = (
        negative
        if (method, path) in NEGATIVE_ONLY
        else st.one_of(positive.map(_without_nul).filter(rule), negative)
    )
    session = requests.Session()

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(session=session)

    with session:
        check()
