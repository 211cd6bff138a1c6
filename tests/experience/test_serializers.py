"""The hand-written fast paths of experience/serializers.py against DRF's own machinery: the
validation of tool_calls and test_result against the nested serializers they replaced, and
ExperienceOutSerializer.to_representation against DRF's field-by-field representation."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from rest_framework import serializers

from experience import serializers as s
from experience.models import Experience
from experience.serializers import (
    MAX_JSON_BYTES,
    MAX_TOOL_CALLS,
    ExperienceInSerializer,
    ExperienceOutSerializer,
)
from tests.experience.factories import store


class NestedReference(ExperienceInSerializer):
    """ExperienceInSerializer with DRF's nested serializers and DRF's field-by-field
    validation, as it was: the rules to match."""

    tool_calls = s.ToolCallRecordSerializer(  # type: ignore[call-arg, assignment]
        many=True, required=False, max_length=MAX_TOOL_CALLS
    )
    test_result = s.TestResultSerializer(required=False, allow_null=True)  # type: ignore[assignment]

    def to_internal_value(self, data: Any) -> Any:
        return serializers.Serializer.to_internal_value(self, data)


BASE = {
    "id": "e1",
    "agent_id": "a",
    "task": "t",
    "reward": 0.5,
    "tool_calls": [{"name": "grep", "arguments": {"q": 1}, "output": "x", "duration_ms": 3}],
    "test_result": {"passed": True, "total": 3, "output": "ok", "duration_ms": 1.5},
}
CALL = {"name": "t"}
TOOL_CALLS: list[Any] = [
    "nope", 5, None, {}, [], [None], [5], ["s"], [[]], [{}],
    [{"name": None}], [{"name": ""}], [{"name": "  "}], [{"name": 12}], [{"name": 1.5}],
    [{"name": True}], [{"name": ["x"]}], [{"name": "x" * 257}], [{"name": " padded "}],
    [{"name": "a\x00b"}], [{"name": "x" * 300 + "\x00"}], [{"name": "a\ud800b\udfff"}],
    [{"name": "é" * 256}], [{**CALL, "arguments": None}], [{**CALL, "arguments": [1, 2]}],
    [{**CALL, "output": None}], [{**CALL, "output": {"deep": [1, {"x": None}]}}],
    [{**CALL, "error": ""}], [{**CALL, "error": "  e  "}], [{**CALL, "error": 5}],
    [{**CALL, "error": True}], [{**CALL, "error": []}], [{**CALL, "error": "e" * 100_001}],
    [{**CALL, "duration_ms": None}], [{**CALL, "duration_ms": -1}],
    [{**CALL, "duration_ms": -0.0}], [{**CALL, "duration_ms": "1"}],
    [{**CALL, "duration_ms": True}], [{**CALL, "duration_ms": float("nan")}],
    [{**CALL, "duration_ms": float("-inf")}], [{**CALL, "duration_ms": 5}],
    [{**CALL, "extra": 1}], [CALL, {"name": None, "duration_ms": -2, "error": []}, None],
    [CALL] * MAX_TOOL_CALLS, [CALL] * (MAX_TOOL_CALLS + 1),
]  # fmt: skip
TEST_RESULTS: list[Any] = [
    None, "nope", 5, [], {}, {"passed": None}, {"passed": "yes"}, {"passed": 1}, {"total": 3},
    {"passed": True}, {"passed": False, "total": -1}, {"passed": True, "total": 1.5},
    {"passed": True, "total": 2.0}, {"passed": True, "total": True},
    {"passed": True, "total": "3"}, {"passed": True, "total": None},
    {"passed": True, "total": 10**30}, {"passed": True, "failed": -1, "errors": -2, "total": "x"},
    {"passed": True, "output": None}, {"passed": True, "output": "  o  "},
    {"passed": True, "output": 5}, {"passed": True, "output": "o" * 100_001},
    {"passed": True, "output": "\x00"}, {"passed": True, "output": []},
    {"passed": True, "duration_ms": -3}, {"passed": True, "duration_ms": "3"},
    {"passed": False, "duration_ms": 7, "extra": 1},
]  # fmt: skip


def outcome(serializer_class: type[serializers.Serializer], data: Any) -> Any:
    serializer = serializer_class(data=data, many=isinstance(data, list))
    valid = serializer.is_valid()
    return valid, json.loads(json.dumps(serializer.validated_data if valid else serializer.errors))


# The top-level fields: None deletes the key.
TOP_LEVEL: list[dict[str, Any]] = [
    {"id": None}, {"id": ""}, {"id": " e2 "}, {"id": 5}, {"id": True}, {"id": "has space"},
    {"id": "stats"}, {"id": "i" * 257}, {"id": "é" * 257}, {"id": "a\x00b"}, {"id": []},
    {"agent_id": None}, {"agent_id": ""}, {"agent_id": "a" * 257}, {"agent_id": 7},
    {"session_id": ""}, {"session_id": "  "}, {"session_id": "s" * 257}, {"session_id": {}},
    {"task": None}, {"task": "  t  "}, {"task": "x" * 20_001}, {"task": "a\ud800"},
    {"reward": None}, {"reward": "1.0"}, {"reward": True}, {"reward": 3}, {"reward": 10**400},
    {"reward": float("nan")}, {"td_error": None}, {"td_error": -2.5}, {"td_error": "x"},
    {"metadata": {}}, {"metadata": {"k": [1, None]}}, {"metadata": []}, {"metadata": "x"},
    {"metadata": {"blob": "x" * 70_000}}, {"ttl_seconds": 0}, {"ttl_seconds": -5},
    {"ttl_seconds": 1.5}, {"ttl_seconds": "5"}, {"ttl_seconds": True}, {"extra": 1},
    {"tool_calls": None}, {"tool_calls": ""}, {"test_result": None},
]  # fmt: skip


def with_change(change: dict[str, Any]) -> Any:
    if not isinstance(change, dict):
        return change
    payload = {**BASE, **change}
    if "id" in change and change["id"] is None:
        del payload["id"]
    if "agent_id" in change and change["agent_id"] is None:
        del payload["agent_id"]
    return payload


@pytest.mark.parametrize("many", [False, True], ids=["one", "list"])
@pytest.mark.parametrize(
    "change",
    [{"tool_calls": v} for v in TOOL_CALLS]
    + [{"test_result": v} for v in TEST_RESULTS]
    + TOP_LEVEL
    + [{}, "not an object", None],
)
def test_fast_validation_is_drfs_field_by_field_one(change, many):
    payload = with_change(change)
    data = [BASE, payload] if many else payload
    assert outcome(ExperienceInSerializer, data) == outcome(NestedReference, data)


def test_tool_calls_over_a_megabyte_of_json_are_refused_as_a_whole():
    # Each call is small; together they exceed the limit (the nested serializer, which ran
    # the size check per call, let this through).
    calls = [{"name": "t", "output": "x" * 10_000}] * 101
    serializer = ExperienceInSerializer(data={**BASE, "tool_calls": calls})
    assert not serializer.is_valid()
    assert serializer.errors == {"tool_calls": [f"At most {MAX_JSON_BYTES} bytes of JSON."]}


def test_integers_too_large_for_a_float_are_a_field_error_not_a_crash():
    # What the stdlib json parser (import_experiences) gives for 1e400 written as digits.
    serializer = ExperienceInSerializer(data={**BASE, "reward": 10**400})
    assert not serializer.is_valid() and "reward" in serializer.errors


@pytest.mark.django_db
def test_experience_representation_is_drfs_field_by_field_one():
    rows = [
        store(),
        store(test_result=None, tool_calls=[], ttl_seconds=0),
        store(td_error=-2.0, metadata={"k": ["v", 1.5, None]}),
    ]
    Experience.objects.filter(pk=rows[2].pk).update(
        times_sampled=3,
        last_sampled_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        created_at=datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC),
        expires_at=datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC) + timedelta(days=1),
    )
    serializer = ExperienceOutSerializer()
    for row in Experience.objects.all():
        generic = serializers.ModelSerializer.to_representation(serializer, row)
        assert serializer.to_representation(row) == dict(generic)


@pytest.mark.django_db
def test_replay_and_batch_answers_are_drfs_field_by_field_ones():
    from experience.selectors import replay_sample

    store(), store(td_error=1.0, metadata={"k": [1, None]})
    batch = replay_sample(
        strategy="prioritized", batch_size=4, alpha=0.6, beta=0.4, half_life=3600.0, seed=1
    )
    body = {"created": 1, "existing": 1, "items": [{"id": "a", "created": True}]}
    pairs: list[tuple[serializers.Serializer, Any]] = [
        (s.ReplayOutSerializer(), batch),
        (s.ExperienceBatchOutSerializer(), body),
    ]
    for serializer, data in pairs:
        generic = serializers.Serializer.to_representation(serializer, data)
        # orjson: replay rows hold their stored JSON as orjson.Fragment
        assert orjson.loads(orjson.dumps(serializer.to_representation(data))) == orjson.loads(
            orjson.dumps(generic)
        )
