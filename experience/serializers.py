"""Input validation and output shapes for the experience API.

Numbers are strict: a string, a boolean, NaN or infinity is a 400, never coerced."""

import math
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from ferrum_memory.core.fields import (
    MAX_COUNT,
    MAX_KEEP_SECONDS,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    finite_number,
    json_size_validator,
    surrogate_error,
    timestamp_out,
    whole_number,
)

from .models import Experience
from .selectors import ExperienceRow

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:@-]{1,256}\Z")
# Paths under /experience/ that an id could otherwise shadow.
RESERVED_IDS = {"stats", "replay", "td-error", "settings"}
MAX_TASK_CHARS = 20_000
MAX_TEXT_CHARS = 100_000
MAX_TOOL_CALLS = 1_000
MAX_JSON_BYTES = 1_000_000
MAX_METADATA_BYTES = 64_000
MAX_BATCH = 1_000
MAX_TD_UPDATES = 10_000
MAX_REPLAY_BATCH = 4_096
MAX_WAIT_MS = 10_000
STRATEGIES = ("prioritized", "recency", "uniform")


# A RegexValidator, so the OpenAPI schema shows the pattern.
validate_experience_id_pattern = RegexValidator(
    ID_PATTERN, "1 to 256 characters from letters, digits and . _ : @ -"
)


def validate_experience_id(value: str) -> None:
    if value in RESERVED_IDS:
        raise serializers.ValidationError(f"'{value}' is reserved.")


class ToolCallRecordSerializer(serializers.Serializer):
    name = StrictCharField(max_length=256)
    # null too: a client that has no arguments may say so either way.
    arguments = serializers.JSONField(default=dict, allow_null=True)
    output = serializers.JSONField(default=None, allow_null=True)
    error = StrictCharField(
        max_length=MAX_TEXT_CHARS, allow_null=True, allow_blank=True, default=None
    )
    duration_ms = StrictFloatField(min_value=0, allow_null=True, default=None)


class TestResultSerializer(serializers.Serializer):
    passed = serializers.BooleanField()
    total = StrictIntegerField(min_value=0, max_value=MAX_COUNT, default=0)
    failed = StrictIntegerField(min_value=0, max_value=MAX_COUNT, default=0)
    # The contract names this field `errors`; DRF's metaclass moves declared fields off the
    # class, so it does not shadow Serializer.errors at run time.
    errors = StrictIntegerField(  # type: ignore[assignment]
        min_value=0, max_value=MAX_COUNT, default=0
    )
    output = StrictCharField(max_length=MAX_TEXT_CHARS, allow_blank=True, default="")
    duration_ms = StrictFloatField(min_value=0, allow_null=True, default=None)

    def to_internal_value(self, data: Any) -> Any:
        # BooleanField accepts "true", 1 and the like; a test result must say true or false.
        if isinstance(data, dict) and not isinstance(data.get("passed"), bool):
            raise serializers.ValidationError({"passed": ["Must be true or false."]})
        return super().to_internal_value(data)


# The nested records in plain Python ----------------------------------------------------------
#
# The two serializers above, nested in ExperienceInSerializer, cost about 0.3 s of validating a
# list of 1,000 experiences: DRF's machinery per field of each record. The fields below apply
# the same rules with the same error messages in a few microseconds a record (a test holds them
# to the serializers), and publish the serializers as their schema.

REQUIRED = object()  # a record key with no default
OPTIONAL = object()  # a record key left out when absent


def _text(
    *,
    max_length: int,
    blank: bool = False,
    null: bool = False,
    validators: tuple[Callable[[str], None], ...] = (),
) -> Callable[[Any], Any]:
    """StrictCharField's rules: a JSON string only, checked as sent, then whitespace trimmed;
    `validators` (the field's own) run before the built-in ones and every error is reported,
    as in DRF."""

    def check(value: Any) -> str | None:
        if value is None:
            if null:
                return None
            raise ValidationError(["This field may not be null."])
        if not isinstance(value, str):
            raise ValidationError([StrictCharField.default_error_messages["invalid"]])
        if not value.strip():
            if blank:
                return ""
            raise ValidationError(["This field may not be blank."])
        errors: list[Any] = []
        for validate in validators:
            try:
                validate(value)
            except ValidationError as exc:
                errors.extend(exc.detail)  # a list, for a message
            except DjangoValidationError as exc:  # a Django validator, such as RegexValidator
                errors.extend(exc.messages)
        if len(value) > max_length:
            errors.append(f"Ensure this field has no more than {max_length} characters.")
        if "\x00" in value:
            errors.append("Null characters are not allowed.")
        if surrogate := surrogate_error(value):
            errors.append(surrogate)
        if errors:
            raise ValidationError(errors)
        return value.strip()

    return check


def _whole(maximum: int) -> Callable[[Any], int]:
    """StrictIntegerField(min_value=0, max_value=maximum)."""

    def check(value: Any) -> int:
        if value is None:
            raise ValidationError(["This field may not be null."])
        value = whole_number(value)
        if value is None:
            raise ValidationError(["An integer is required."])
        if value < 0:
            raise ValidationError(["Ensure this value is greater than or equal to 0."])
        if value > maximum:
            raise ValidationError([f"Ensure this value is less than or equal to {maximum}."])
        return value

    return check


_count = _whole(MAX_COUNT)


def _duration(value: Any) -> float | None:
    """StrictFloatField(min_value=0, allow_null=True)."""
    if value is None:
        return None
    number = finite_number(value)
    if number is None:
        raise ValidationError(["A finite number is required."])
    if number < 0:
        raise ValidationError(["Ensure this value is greater than or equal to 0."])
    return number


def _json(*, null: bool) -> Callable[[Any], Any]:
    """A JSONField: anything a JSON parser gives."""

    def check(value: Any) -> Any:
        if value is None and not null:
            raise ValidationError(["This field may not be null."])
        return value

    return check


def _number(*, null: bool) -> Callable[[Any], Any]:
    """StrictFloatField."""

    def check(value: Any) -> float | None:
        if value is None:
            if null:
                return None
            raise ValidationError(["This field may not be null."])
        number = finite_number(value)
        if number is None:
            raise ValidationError(["A finite number is required."])
        return number

    return check


def _sized(check: Callable[[Any], Any], limit: int) -> Callable[[Any], Any]:
    """`check`, then json_size_validator(limit) on what it returns."""
    validate = json_size_validator(limit)

    def sized(value: Any) -> Any:
        value = check(value)
        try:
            validate(value)
        except serializers.ValidationError as exc:
            raise ValidationError(exc.detail) from None
        return value

    return sized


def _mapping(value: Any) -> dict[str, Any]:
    """DictField: a JSON object, any values."""
    if value is None:
        raise ValidationError(["This field may not be null."])
    if not isinstance(value, dict):
        kind = type(value).__name__
        raise ValidationError([f'Expected a dictionary of items but got type "{kind}".'])
    return {str(key): item for key, item in value.items()}


Shape = tuple[tuple[str, Callable[[Any], Any], Any], ...]  # (key, check, default factory)

TOOL_CALL: Shape = (
    ("name", _text(max_length=256), REQUIRED),
    ("arguments", _json(null=True), dict),
    ("output", _json(null=True), lambda: None),
    ("error", _text(max_length=MAX_TEXT_CHARS, blank=True, null=True), lambda: None),
    ("duration_ms", _duration, lambda: None),
)
TEST_RESULT: Shape = (
    ("passed", bool, REQUIRED),  # checked to be a JSON boolean first
    ("total", _count, int),
    ("failed", _count, int),
    ("errors", _count, int),
    ("output", _text(max_length=MAX_TEXT_CHARS, blank=True), str),
    ("duration_ms", _duration, lambda: None),
)


def _record(data: Any, shape: Shape) -> dict[str, Any]:
    """A Serializer's rules: a JSON object; unknown keys dropped; errors per key; a key with
    the default OPTIONAL is left out when absent."""
    if not isinstance(data, dict):
        message = f"Invalid data. Expected a dictionary, but got {type(data).__name__}."
        raise ValidationError({"non_field_errors": [message]})
    record: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    for key, check, default in shape:
        if key not in data:
            if default is REQUIRED:
                errors[key] = ["This field is required."]
            elif default is not OPTIONAL:
                record[key] = default()
            continue
        try:
            record[key] = check(data[key])
        except ValidationError as exc:
            errors[key] = exc.detail
    if errors:
        raise ValidationError(errors)
    return record


@extend_schema_field(
    ToolCallRecordSerializer(many=True, max_length=MAX_TOOL_CALLS)  # type: ignore[call-arg]
)
class ToolCallsField(serializers.Field):
    """ToolCallRecordSerializer(many=True, max_length=MAX_TOOL_CALLS), fast."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        if not isinstance(data, list):
            message = f'Expected a list of items but got type "{type(data).__name__}".'
            raise ValidationError({"non_field_errors": [message]})
        if len(data) > MAX_TOOL_CALLS:
            message = f"Ensure this field has no more than {MAX_TOOL_CALLS} elements."
            raise ValidationError({"non_field_errors": [message]})
        calls, errors = [], {}  # errors by index, as DRF's ListSerializer keys them
        for index, item in enumerate(data):
            try:
                if item is None:
                    raise ValidationError(["This field may not be null."])
                calls.append(_record(item, TOOL_CALL))
            except ValidationError as exc:
                errors[index] = exc.detail
        if errors:
            raise ValidationError(errors)  # type: ignore[arg-type]  # int keys, as DRF's
        return calls

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(TestResultSerializer(allow_null=True))
class TestResultField(serializers.Field):
    """TestResultSerializer(allow_null=True), fast."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and not isinstance(data.get("passed"), bool):
            raise ValidationError({"passed": ["Must be true or false."]})
        return _record(data, TEST_RESULT)

    def to_representation(self, value: Any) -> Any:
        return value


class ExperienceInSerializer(serializers.Serializer):
    # The fields declare the rules and the schema; to_internal_value applies them in plain
    # Python (DRF's per-field machinery was 70 ms of validating 1,000 experiences). A test
    # holds the two to the same results and errors.
    id = StrictCharField(
        max_length=256,
        required=False,
        validators=[validate_experience_id_pattern, validate_experience_id],
        help_text="Your id for this experience; sending it again (in a later request, or "
        "later in the same list) returns the stored one.",
    )
    agent_id = StrictCharField(max_length=256)
    session_id = StrictCharField(max_length=256, required=False, allow_blank=True)
    task = StrictCharField(max_length=MAX_TASK_CHARS)
    tool_calls = ToolCallsField(required=False, validators=[json_size_validator(MAX_JSON_BYTES)])
    test_result = TestResultField(required=False, allow_null=True)
    reward = StrictFloatField()
    td_error = StrictFloatField(required=False, allow_null=True)
    metadata = serializers.DictField(
        required=False, validators=[json_size_validator(MAX_METADATA_BYTES)]
    )
    ttl_seconds = StrictIntegerField(
        min_value=0,
        max_value=MAX_KEEP_SECONDS,
        required=False,
        help_text="Seconds to keep it; 0 keeps it forever. Default: DEFAULT_REPLAY_TTL.",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        return _record(data, EXPERIENCE)

    def run_validators(self, value: Any) -> None:
        # It has none; DRF would still gather every field's read-only default for them, per
        # item (a tenth of validating a list).
        if self.validators:
            super().run_validators(value)


EXPERIENCE: Shape = (
    (
        "id",
        _text(max_length=256, validators=(validate_experience_id_pattern, validate_experience_id)),
        OPTIONAL,
    ),
    ("agent_id", _text(max_length=256), REQUIRED),
    ("session_id", _text(max_length=256, blank=True), OPTIONAL),
    ("task", _text(max_length=MAX_TASK_CHARS), REQUIRED),
    ("tool_calls", _sized(ToolCallsField().run_validation, MAX_JSON_BYTES), OPTIONAL),
    ("test_result", TestResultField(allow_null=True).run_validation, OPTIONAL),
    ("reward", _number(null=False), REQUIRED),
    ("td_error", _number(null=True), OPTIONAL),
    ("metadata", _sized(_mapping, MAX_METADATA_BYTES), OPTIONAL),
    ("ttl_seconds", _whole(MAX_KEEP_SECONDS), OPTIONAL),
)


class ExperienceOutSerializer(serializers.ModelSerializer):
    # An experience as every endpoint shows it. The fields declare the shape and the schema;
    # to_representation builds it by hand.
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
            "retired_at",
        ]

    def to_representation(self, instance: Experience | ExperienceRow) -> dict[str, Any]:
        # DRF's field-by-field path took 40 ms for a replay batch of 256. The stored JSON was
        # validated on its way in, so it is returned as stored. A test holds this to the fields.
        # A replay batch brings ExperienceRow tuples, which have the same attributes.
        return {
            "id": instance.experience_id,
            "agent_id": instance.agent_id,
            "session_id": instance.session_id,
            "task": instance.task,
            "tool_calls": instance.tool_calls,
            "test_result": instance.test_result,
            "passed": instance.passed,
            "reward": instance.reward,
            "td_error": instance.td_error,
            "priority": instance.priority,
            "metadata": instance.metadata,
            "created_at": timestamp_out(instance.created_at),
            "expires_at": timestamp_out(instance.expires_at),
            "times_sampled": instance.times_sampled,
            "last_sampled_at": timestamp_out(instance.last_sampled_at),
            "retired_at": timestamp_out(instance.retired_at),
        }


class ExperienceCreatedItemSerializer(serializers.Serializer):
    id = serializers.CharField()
    created = serializers.BooleanField(help_text="False: the id was stored before, unchanged.")


class ExperienceBatchOutSerializer(serializers.Serializer):
    """The answer to a list: counts, and each id in the order sent (GET one to see it whole)."""

    created = serializers.IntegerField()
    existing = serializers.IntegerField()
    items = ExperienceCreatedItemSerializer(many=True)

    def to_representation(self, body: dict[str, Any]) -> dict[str, Any]:
        # By hand: DRF's nested path cost 15 ms for 1,000 items. The view builds the items.
        return {"created": body["created"], "existing": body["existing"], "items": body["items"]}


class TdErrorUpdateSerializer(serializers.Serializer):
    experience_id = StrictCharField(max_length=256)
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
    agent_id = StrictCharField(max_length=256, required=False)
    seed = serializers.IntegerField(min_value=0, max_value=2**63 - 1, required=False)
    min_size = serializers.IntegerField(min_value=1, default=1)
    stratified = serializers.BooleanField(default=False)
    wait_ms = serializers.IntegerField(
        min_value=0,
        max_value=MAX_WAIT_MS,
        default=0,
        help_text="With the agent's rate limiter on: wait up to this long for inserts, "
        "instead of answering 429 at once.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # alpha left out: the agent's own (its replay settings); beta: REPLAY_BETA.
        attrs.setdefault("beta", settings.REPLAY_BETA)
        for name in ("alpha", "beta", "half_life"):
            if name in attrs and not math.isfinite(attrs[name]):
                raise serializers.ValidationError({name: ["A finite number is required."]})
        return attrs


class ReplayRateLimitedSerializer(serializers.Serializer):
    """A 429 of GET /experience/replay: the agent's rate limiter (all fields), or the key's
    request throttle (`detail` only)."""

    detail = serializers.CharField()
    ratio = serializers.FloatField(
        required=False, allow_null=True, help_text="Samples per insert so far."
    )
    samples = serializers.IntegerField(required=False, help_text="Draws the limiter granted.")
    inserts = serializers.IntegerField(required=False)
    inserts_needed = serializers.IntegerField(
        required=False, help_text="Inserts to wait for before this draw is granted."
    )
    samples_per_insert = serializers.FloatField(required=False)
    spi_tolerance = serializers.FloatField(required=False)
    min_size = serializers.IntegerField(required=False)


REMOVERS = ("fifo", "lowest_priority")


class ReplaySettingsQuerySerializer(serializers.Serializer):
    # Not trimmed, so that the maxLength the schema states holds of the value as sent.
    agent_id = StrictCharField(max_length=256, trim_whitespace=False)


class ReplaySettingsInSerializer(serializers.Serializer):
    """PUT /experience/settings: each setting left out takes its default (REPLAY_*)."""

    agent_id = StrictCharField(max_length=256, trim_whitespace=False)
    max_size = StrictIntegerField(
        min_value=0, max_value=MAX_COUNT, required=False, help_text="Capacity; 0: none."
    )
    remover = serializers.ChoiceField(
        choices=REMOVERS,
        required=False,
        help_text="Which items go past max_size: fifo (oldest first) or lowest_priority.",
    )
    max_times_sampled = StrictIntegerField(
        min_value=0,
        max_value=2**31 - 1,
        required=False,
        help_text="An item drawn this many times is retired; 0: no cap.",
    )
    min_size = StrictIntegerField(
        min_value=0,
        max_value=MAX_COUNT,
        required=False,
        help_text="The rate limiter grants no draw before the agent holds this many items.",
    )
    samples_per_insert = StrictFloatField(
        min_value=0, max_value=1e9, required=False, help_text="0: no rate limiter."
    )
    spi_tolerance = StrictFloatField(
        min_value=0, max_value=1e12, required=False, help_text="Draws granted ahead of the ratio."
    )
    alpha = StrictFloatField(
        min_value=0, max_value=10, required=False, help_text="The agent's default PER exponent."
    )


class ReplayLimiterSerializer(serializers.Serializer):
    inserts = serializers.IntegerField()
    samples = serializers.IntegerField()
    size = serializers.IntegerField()
    ratio = serializers.FloatField(allow_null=True, help_text="Samples per insert so far.")
    allowed = serializers.FloatField(help_text="Draws the limiter would grant now.")
    inserts_needed = serializers.IntegerField(help_text="Before a draw of one is granted.")


class ReplaySettingsOutSerializer(serializers.Serializer):
    agent_id = serializers.CharField()
    max_size = serializers.IntegerField()
    remover = serializers.ChoiceField(choices=REMOVERS)
    max_times_sampled = serializers.IntegerField()
    min_size = serializers.IntegerField()
    samples_per_insert = serializers.FloatField()
    spi_tolerance = serializers.FloatField()
    alpha = serializers.FloatField()
    customized = serializers.BooleanField(help_text="False: the agent has the defaults.")
    limiter = ReplayLimiterSerializer()


class ReplayItemSerializer(serializers.Serializer):
    experience = ExperienceOutSerializer()
    probability = serializers.FloatField()
    weight = serializers.FloatField(help_text="Importance-sampling weight, max-normalised.")

    def to_representation(self, item: Any) -> dict[str, Any]:
        # By hand, like ExperienceOutSerializer: a batch holds up to 4,096 items.
        return {
            "experience": self.fields["experience"].to_representation(item.experience),
            "probability": item.probability,
            "weight": item.weight,
        }


class ReplayOutSerializer(serializers.Serializer):
    strategy = serializers.CharField()
    buffer_size = serializers.IntegerField()
    alpha = serializers.FloatField()
    beta = serializers.FloatField()
    seed = serializers.IntegerField(allow_null=True)
    items = ReplayItemSerializer(many=True)

    def to_representation(self, batch: Any) -> dict[str, Any]:
        # By hand, like the items: DRF's list machinery per item was a tenth of the request.
        item = self.fields["items"].child.to_representation  # type: ignore[attr-defined]
        return {
            "strategy": batch.strategy,
            "buffer_size": batch.buffer_size,
            "alpha": batch.alpha,
            "beta": batch.beta,
            "seed": batch.seed,
            "items": [item(i) for i in batch.items],
        }


class ExperienceListQuerySerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256, required=False)
    session_id = StrictCharField(max_length=256, required=False)
    passed = serializers.BooleanField(required=False, allow_null=True, default=None)
    sampled = serializers.BooleanField(required=False, allow_null=True, default=None)
