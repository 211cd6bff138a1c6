from rest_framework import serializers

from experience.serializers import (
    MAX_KEEP_SECONDS,
    StrictFloatField,
    StrictIntegerField,
    json_size_validator,
)
from experience.serializers import CharField as StrictCharField

from .models import MemoryItem

MAX_CONTENT_CHARS = 20_000
MAX_BATCH = 256
MAX_TAGS = 32
MODES = ("hybrid", "dense", "sparse")


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
            "tags",
            "metadata",
            "created_at",
            "expires_at",
            "access_count",
            "embedding_model",
        ]


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
    created_after = serializers.DateTimeField(
        required=False, help_text="Items created at or after this instant."
    )
    created_before = serializers.DateTimeField(
        required=False,
        help_text="Items created at or before this instant; earlier than created_after: none.",
    )
    min_importance = StrictFloatField(min_value=0, max_value=1, required=False)


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
