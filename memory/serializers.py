from typing import Any

from rest_framework import serializers

from ferrum_memory.core.fields import (
    MAX_COUNT,
    MAX_KEEP_SECONDS,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    json_size_validator,
)

from .models import MemoryEvent, MemoryItem

MAX_CONTENT_CHARS = 20_000
MAX_BATCH = 256
MAX_TAGS = 32
MODES = ("hybrid", "dense", "sparse")
SENSITIVITY_HELP = (
    "How sensitive the content is, from least to most: none, low, pii (personal data), "
    "sensitive. Readers filter with max_sensitivity."
)


class MemoryInSerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256)
    session_id = StrictCharField(max_length=256, required=False, allow_blank=True)
    kind = serializers.ChoiceField(
        choices=MemoryItem.Kind.choices, default=MemoryItem.Kind.EPISODIC
    )
    # `source` is also a DRF Field attribute; as a declared field it is moved off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=MemoryItem.Source.choices, default=MemoryItem.Source.AGENT
    )
    content = StrictCharField(max_length=MAX_CONTENT_CHARS)
    importance = StrictFloatField(min_value=0, max_value=1, default=0.5)
    sensitivity = serializers.ChoiceField(
        choices=MemoryItem.Sensitivity.choices,
        default=MemoryItem.Sensitivity.NONE,
        help_text=SENSITIVITY_HELP,
    )
    tags = serializers.ListField(
        child=StrictCharField(max_length=100), max_length=MAX_TAGS, default=list
    )
    metadata = serializers.DictField(default=dict, validators=[json_size_validator(64_000)])
    ttl_seconds = StrictIntegerField(
        min_value=0,
        max_value=MAX_KEEP_SECONDS,
        required=False,
        help_text="Seconds to keep it; 0 forever. Default: DEFAULT_MEMORY_TTL.",
    )


class MemoryOutSerializer(serializers.ModelSerializer):
    point_id = serializers.UUIDField(source="id")

    class Meta:
        model = MemoryItem
        fields = [
            "point_id",
            "agent_id",
            "session_id",
            "kind",
            "source",
            "content",
            "importance",
            "sensitivity",
            "tags",
            "metadata",
            "created_at",
            "expires_at",
            "access_count",
            "embedding_model",
            "version",
        ]


class MemoryListQuerySerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256, required=False)
    session_id = StrictCharField(max_length=256, required=False)
    kind = serializers.ChoiceField(choices=MemoryItem.Kind.choices, required=False)
    # `source` is also a DRF Field attribute; as a declared field it is moved off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=MemoryItem.Source.choices, required=False
    )
    sensitivity = serializers.ChoiceField(choices=MemoryItem.Sensitivity.choices, required=False)
    # A query is read like a form: `tags=` (empty) counts as not given.
    tags = serializers.ListField(
        child=StrictCharField(max_length=100, allow_blank=True),
        required=False,
        max_length=MAX_TAGS,
        help_text="Items with every tag given (repeat the parameter for several).",
    )
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _created_range(attrs)


def _created_range(attrs: dict[str, Any]) -> dict[str, Any]:
    after, before = attrs.get("created_after"), attrs.get("created_before")
    if after and before and after > before:
        raise serializers.ValidationError({"created_before": ["Must not be before created_after."]})
    return attrs


class MemoryPatchSerializer(serializers.Serializer):
    """Some fields of an item, and always the version read last."""

    # DRF and drf-spectacular make a PATCH body partial (every field optional); `version` is
    # required all the same, so this serializer is never partial.
    @property
    def partial(self) -> bool:
        return False

    @partial.setter
    def partial(self, value: bool) -> None:
        pass

    version = StrictIntegerField(
        min_value=1,
        max_value=MAX_COUNT,
        help_text="The version read last; a stale one gets 409 with current_version.",
    )
    content = StrictCharField(max_length=MAX_CONTENT_CHARS, required=False)
    importance = StrictFloatField(min_value=0, max_value=1, required=False)
    sensitivity = serializers.ChoiceField(
        choices=MemoryItem.Sensitivity.choices, required=False, help_text=SENSITIVITY_HELP
    )
    tags = serializers.ListField(
        child=StrictCharField(max_length=100), max_length=MAX_TAGS, required=False
    )
    metadata = serializers.DictField(required=False, validators=[json_size_validator(64_000)])
    ttl_seconds = StrictIntegerField(
        min_value=0,
        max_value=MAX_KEEP_SECONDS,
        required=False,
        help_text="Seconds to keep it from now; 0 forever.",
    )


class MemoryEventSerializer(serializers.ModelSerializer):
    changes = serializers.DictField(
        help_text="Each changed field's value before and after: {field: {before, after}}."
    )

    class Meta:
        model = MemoryEvent
        fields = ["point_id", "kind", "at", "actor", "version", "changes", "other_point_id"]


class StoredMemorySerializer(serializers.Serializer):
    point_id = serializers.UUIDField(source="item.id")
    duplicate = serializers.ChoiceField(
        choices=["", "exact", "near"],
        help_text="Set when the item was merged into the existing memory point_id, not stored.",
    )
    indexed = serializers.BooleanField(
        help_text="False when the vector index is down; indexed later."
    )
    item = MemoryOutSerializer()


class StoredMemoryBatchSerializer(serializers.Serializer):
    items = StoredMemorySerializer(many=True)


class MemorySearchSerializer(serializers.Serializer):
    query = StrictCharField(max_length=MAX_CONTENT_CHARS)
    agent_id = StrictCharField(max_length=256)
    limit = serializers.IntegerField(min_value=1, max_value=100, default=10)
    mode = serializers.ChoiceField(choices=MODES, default="hybrid")
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=MemoryItem.Kind.choices), default=list, max_length=4
    )
    tags = serializers.ListField(
        child=StrictCharField(max_length=100), default=list, max_length=MAX_TAGS
    )
    session_id = StrictCharField(max_length=256, required=False, allow_blank=True, default="")
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    min_importance = StrictFloatField(min_value=0, max_value=1, required=False)
    max_sensitivity = serializers.ChoiceField(
        choices=MemoryItem.Sensitivity.choices,
        required=False,
        help_text="Only items at most this sensitive (none < low < pii < sensitive). "
        "Default: every level.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _created_range(attrs)


class MemoryHitSerializer(serializers.Serializer):
    score = serializers.FloatField(
        help_text=(
            "Higher ranks first. hybrid: the sum of the dense and BM25 z-scores among the "
            "candidates (can be negative); dense: cosine similarity; sparse: BM25; with "
            "rerank: the cross-encoder's score."
        )
    )
    item = MemoryOutSerializer()


class MemorySearchOutSerializer(serializers.Serializer):
    results = MemoryHitSerializer(many=True)
