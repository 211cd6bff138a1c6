"""Input validation and output shapes for the experience API.

Numbers are strict: a string, a boolean, NaN or infinity is a 400, never coerced."""

import json
import math
import re
from typing import Any

from django.conf import settings
from rest_framework import serializers

from .models import Experience

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:@-]{1,256}$")
# Paths under /experience/ that an id could otherwise shadow.
RESERVED_IDS = {"stats", "replay", "td-error"}
MAX_TASK_CHARS = 20_000
MAX_TEXT_CHARS = 100_000
MAX_TOOL_CALLS = 1_000
MAX_JSON_BYTES = 1_000_000
MAX_METADATA_BYTES = 64_000
MAX_BATCH = 1_000
MAX_TD_UPDATES = 10_000
MAX_REPLAY_BATCH = 4_096
STRATEGIES = ("prioritized", "recency", "uniform")


class StrictFloatField(serializers.FloatField):
    """A JSON number that is finite: no strings, booleans, NaN or infinity."""

    default_error_messages = {
        "invalid": "A finite number is required.",
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float) or not math.isfinite(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "An integer is required."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


def json_size_validator(limit: int) -> Any:
    def validate(value: Any) -> None:
        if len(json.dumps(value)) > limit:
            raise serializers.ValidationError(f"At most {limit} bytes of JSON.")

    return validate


def validate_experience_id(value: str) -> None:
    if not ID_PATTERN.match(value):
        raise serializers.ValidationError("1 to 256 characters from letters, digits and . _ : @ -")
    if value in RESERVED_IDS:
        raise serializers.ValidationError(f"'{value}' is reserved.")


class ToolCallRecordSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=256)
    arguments = serializers.JSONField(default=dict)
    output = serializers.JSONField(default=None, allow_null=True)
    error = serializers.CharField(
        max_length=MAX_TEXT_CHARS, allow_null=True, allow_blank=True, default=None
    )
    duration_ms = StrictFloatField(min_value=0, allow_null=True, default=None)


class TestResultSerializer(serializers.Serializer):
    passed = serializers.BooleanField()
    total = StrictIntegerField(min_value=0, default=0)
    failed = StrictIntegerField(min_value=0, default=0)
    # The contract names this field `errors`; DRF's metaclass moves declared fields off the
    # class, so it does not shadow Serializer.errors at run time.
    errors = StrictIntegerField(min_value=0, default=0)  # type: ignore[assignment]
    output = serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, default="")
    duration_ms = StrictFloatField(min_value=0, allow_null=True, default=None)

    def to_internal_value(self, data: Any) -> Any:
        # BooleanField accepts "true", 1 and the like; a test result must say true or false.
        if isinstance(data, dict) and not isinstance(data.get("passed"), bool):
            raise serializers.ValidationError({"passed": ["Must be true or false."]})
        return super().to_internal_value(data)


class ExperienceInSerializer(serializers.Serializer):
    id = serializers.CharField(
        max_length=256,
        required=False,
        validators=[validate_experience_id],
        help_text="Your id for this experience; sending it again returns the stored one.",
    )
    agent_id = serializers.CharField(max_length=256)
    session_id = serializers.CharField(max_length=256, required=False, allow_blank=True)
    task = serializers.CharField(max_length=MAX_TASK_CHARS)
    tool_calls = ToolCallRecordSerializer(  # type: ignore[call-arg]  # max_length: list kwarg
        many=True,
        required=False,
        max_length=MAX_TOOL_CALLS,
        validators=[json_size_validator(MAX_JSON_BYTES)],
    )
    test_result = TestResultSerializer(required=False, allow_null=True)
    reward = StrictFloatField()
    td_error = StrictFloatField(required=False, allow_null=True)
    metadata = serializers.DictField(
        required=False, validators=[json_size_validator(MAX_METADATA_BYTES)]
    )
    ttl_seconds = StrictIntegerField(
        min_value=0,
        required=False,
        help_text="Seconds to keep it; 0 keeps it forever. Default: DEFAULT_REPLAY_TTL.",
    )


class ExperienceOutSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="experience_id")
    tool_calls = ToolCallRecordSerializer(many=True)
    test_result = TestResultSerializer(allow_null=True)

    class Meta:
        model = Experience
        fields = [
            "id",
            "agent_id",
            "session_id",
            "task",
            "tool_calls",
            "test_result",
            "passed",
            "reward",
            "td_error",
            "priority",
            "metadata",
            "created_at",
            "expires_at",
            "times_sampled",
            "last_sampled_at",
        ]


class ExperienceBatchOutSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    existing = serializers.IntegerField()
    items = ExperienceOutSerializer(many=True)


class TdErrorUpdateSerializer(serializers.Serializer):
    experience_id = serializers.CharField(max_length=256)
    td_error = StrictFloatField()


class TdErrorBatchSerializer(serializers.Serializer):
    updates = TdErrorUpdateSerializer(  # type: ignore[call-arg]  # max_length: list kwarg
        many=True, allow_empty=False, max_length=MAX_TD_UPDATES
    )


class TdErrorResultSerializer(serializers.Serializer):
    updated = serializers.IntegerField()
    unknown_ids = serializers.ListField(child=serializers.CharField())


class ReplayQuerySerializer(serializers.Serializer):
    strategy = serializers.ChoiceField(choices=STRATEGIES, default="prioritized")
    batch_size = serializers.IntegerField(min_value=1, max_value=MAX_REPLAY_BATCH, default=32)
    alpha = serializers.FloatField(min_value=0, max_value=10, required=False)
    beta = serializers.FloatField(min_value=0, max_value=1, required=False)
    half_life = serializers.FloatField(
        min_value=1e-3,
        default=3600.0,
        help_text="Seconds; recency weight 0.5 ** (age / half_life).",
    )
    agent_id = serializers.CharField(max_length=256, required=False)
    seed = serializers.IntegerField(min_value=0, max_value=2**63 - 1, required=False)
    min_size = serializers.IntegerField(min_value=1, default=1)
    stratified = serializers.BooleanField(default=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("alpha", settings.REPLAY_ALPHA)
        attrs.setdefault("beta", settings.REPLAY_BETA)
        for name in ("alpha", "beta", "half_life"):
            if not math.isfinite(attrs[name]):
                raise serializers.ValidationError({name: ["A finite number is required."]})
        return attrs


class ReplayItemSerializer(serializers.Serializer):
    experience = ExperienceOutSerializer()
    probability = serializers.FloatField()
    weight = serializers.FloatField(help_text="Importance-sampling weight, max-normalised.")


class ReplayOutSerializer(serializers.Serializer):
    strategy = serializers.CharField()
    buffer_size = serializers.IntegerField()
    alpha = serializers.FloatField()
    beta = serializers.FloatField()
    seed = serializers.IntegerField(allow_null=True)
    items = ReplayItemSerializer(many=True)


class ExperienceListQuerySerializer(serializers.Serializer):
    agent_id = serializers.CharField(max_length=256, required=False)
    session_id = serializers.CharField(max_length=256, required=False)
    passed = serializers.BooleanField(required=False, allow_null=True, default=None)
    sampled = serializers.BooleanField(required=False, allow_null=True, default=None)
