"""Input limits: every text field and list has a documented maximum, the body size is capped,
deep nesting and NUL characters are refused; each a 400, never a 500 (on SQLite and PostgreSQL)."""

from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from ferrum_memory.core.parsers import MAX_JSON_DEPTH, json_depth_exceeds
from memory.serializers import MAX_CONTENT_CHARS
from sessions.serializers import MAX_TASK_CHARS

# Strings whose length a format or a list of values already bounds.
BOUNDED_FORMATS = {"uuid", "date-time", "date", "uri"}


def nested(depth: int) -> Any:
    """JSON arrays and objects nested `depth` deep (the outermost counts as one)."""
    value: Any = {}
    for level in range(depth - 1):
        value = {"k": value} if level % 2 else [value]
    return value


def unbounded(schema: dict[str, Any], where: str) -> list[str]:
    """The places in a request schema where a string or a list has no maximum."""
    found = []
    if schema.get("type") == "string":
        if "maxLength" not in schema and "enum" not in schema:
            if schema.get("format") not in BOUNDED_FORMATS:
                found.append(where)
    if schema.get("type") == "array":
        if "maxItems" not in schema:
            found.append(where)
        found += unbounded(schema.get("items", {}), f"{where}[]")
    for name, prop in schema.get("properties", {}).items():
        found += unbounded(prop, f"{where}.{name}")
    for key in ("oneOf", "anyOf", "allOf"):
        for i, option in enumerate(schema.get(key, [])):
            found += unbounded(option, f"{where}/{key}{i}")
    return found


def test_every_request_text_field_and_list_has_a_documented_maximum():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found = []
    for name, component in schema["components"]["schemas"].items():
        if name.endswith("Request"):  # COMPONENT_SPLIT_REQUEST: what clients send
            found += unbounded(component, name)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                where = f"{method.upper()} {path} ?{parameter['name']}"
                found += unbounded(parameter["schema"], where)
    assert not found, f"No documented maximum: {found}"


@pytest.mark.parametrize(
    ("depth", "too_deep"), [(1, False), (MAX_JSON_DEPTH, False), (MAX_JSON_DEPTH + 1, True)]
)
def test_json_depth_counts_arrays_and_objects(depth, too_deep):
    assert json_depth_exceeds(nested(depth), MAX_JSON_DEPTH) is too_deep
    assert json_depth_exceeds("scalar", 0) is False


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body"),
    [
        # 300 levels: orjson cannot write them back, so this was a 500 (the metadata size check).
        ("/memory/search", {"agent_id": "a", "query": "q", "tags": nested(300)}),
        ("/session/start", {"agent_id": "a", "metadata": nested(MAX_JSON_DEPTH)}),
        ("/experience/", {"agent_id": "a", "task": "t", "reward": 1, "metadata": nested(300)}),
    ],
)
def test_deeply_nested_json_is_a_400(api_client, path, body):
    response = api_client.post(path, body, format="json")
    assert response.status_code == 400
    assert f"deeper than {MAX_JSON_DEPTH} levels" in response.json()["detail"]


@pytest.mark.django_db
def test_json_at_the_depth_limit_is_accepted(api_client):
    # The body is one level, metadata the next: MAX_JSON_DEPTH levels in all.
    body = {"agent_id": "a", "metadata": nested(MAX_JSON_DEPTH - 1)}
    assert api_client.post("/session/start", body, format="json").status_code == 201


@pytest.mark.django_db
def test_a_body_over_the_size_cap_is_a_400(api_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    body = {"agent_id": "a", "task": "t" * 2_000}
    response = api_client.post("/session/start", body, format="json")
    assert response.status_code == 400
    assert "larger than 1000 bytes" in response.json()["detail"]
    small = api_client.post("/session/start", {"agent_id": "a", "task": "t"}, format="json")
    assert small.status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body"),
    [
        # Free-form JSON is jsonb on PostgreSQL, which cannot hold \u0000: this was a 500.
        ("/experience/", {"agent_id": "a", "task": "t", "reward": 1, "metadata": {"n": "\u0000"}}),
        ("/session/start", {"agent_id": "a", "metadata": {"note": "nul \u0000 here"}}),
        ("/session/start", {"agent_id": "a", "tool_state": {"k\u0000": 1}}),
    ],
)
def test_a_nul_character_anywhere_is_a_400(api_client, path, body):
    response = api_client.post(path, body, format="json")
    assert response.status_code == 400
    assert "NUL" in response.json()["detail"]


@pytest.mark.django_db
def test_the_text_backslash_u0000_is_not_a_nul(api_client):
    body = {"agent_id": "a", "task": "a literal \\u0000 in code"}
    response = api_client.post("/session/start", body, format="json")
    assert response.status_code == 201
    assert response.json()["task"] == "a literal \\u0000 in code"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/session/start", {"agent_id": "a", "task": "t" * (MAX_TASK_CHARS + 1)}, "task"),
        ("/session/start", {"agent_id": "a" * 257}, "agent_id"),
        ("/memory/search", {"agent_id": "a", "query": "q" * (MAX_CONTENT_CHARS + 1)}, "query"),
        ("/experience/", {"agent_id": "a", "task": "t", "reward": 1, "id": "i" * 257}, "id"),
    ],
)
def test_over_long_text_is_a_400_naming_the_field(api_client, path, body, field):
    response = api_client.post(path, body, format="json")
    assert response.status_code == 400
    assert field in response.json()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("post", "/session/start", {"agent_id": "a" + " " * 256, "task": "t"}),
        ("post", "/experience/", {"agent_id": "a", "task": "t", "reward": 1, "id": " i"}),
        ("get", "/dream/cycles/", {"agent_id": "a" + "\t" * 256}),
        ("get", "/experience/", {"session_id": "s" + "\t" * 256}),
    ],
)
def test_text_is_checked_as_sent_not_as_trimmed(api_client, method, path, data):
    """The schema's maxLength and pattern are the text's as sent: one that fits only once its
    whitespace is trimmed is refused (schemathesis found an id of 6 characters and 250 tabs
    accepted), as is an id whose pattern only its trimmed text matches."""
    body = {"format": "json"} if method == "post" else {}
    response = getattr(api_client, method)(path, data, **body)
    assert response.status_code == 400, response.json()
    assert response.json().keys() & {"agent_id", "id", "session_id"}


@pytest.mark.django_db
def test_text_within_its_limits_is_stored_trimmed(api_client):
    response = api_client.post("/session/start", {"agent_id": " a\t", "task": "t "}, format="json")
    assert response.status_code == 201, response.json()
    session = api_client.get(f"/session/{response.json()['session_id']}").json()
    assert (session["agent_id"], session["task"]) == ("a", "t")


@pytest.mark.django_db
@pytest.mark.parametrize("ttl_seconds", [10**13, 2**62])
def test_a_ttl_beyond_a_century_is_a_400_not_a_date_overflow(api_client, ttl_seconds):
    # Found by schemathesis: now + ttl overflowed the date, a 500.
    body = {"agent_id": "a", "content": "c", "ttl_seconds": ttl_seconds}
    response = api_client.post("/memory/store", body, format="json")
    assert response.status_code == 400
    assert "ttl_seconds" in response.json()
    experience = {"agent_id": "a", "task": "t", "reward": 1, "ttl_seconds": ttl_seconds}
    response = api_client.post("/experience/", experience, format="json")
    assert response.status_code == 400
    assert "ttl_seconds" in response.json()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        # Found by schemathesis: DRF stored the number's text where the schema says string.
        ("/experience/", {"agent_id": "a", "task": 5, "reward": 1}, "task"),
        ("/session/start", {"agent_id": 7}, "agent_id"),
        ("/memory/search", {"agent_id": "a", "query": 1.5}, "query"),
    ],
)
def test_a_number_where_text_belongs_is_a_400(api_client, path, body, field):
    response = api_client.post(path, body, format="json")
    assert response.status_code == 400
    assert response.json()[field] == ["A string is required."]
