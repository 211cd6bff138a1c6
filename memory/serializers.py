import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ferrum_memory.core.fields import (
    MAX_COUNT,
    MAX_KEEP_SECONDS,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    json_size_validator,
    timestamp_out,
)

from .context import DEFAULT_RECENT_SHARE, MAX_TOKEN_BUDGET
from .models import MemoryEvent, MemoryItem

MAX_CONTENT_CHARS = 20_000
MAX_BATCH = 256
MAX_TAGS = 32
# GET /memory/'s tags: at most MAX_TAGS comma-separated tags of at most 100 characters, no NUL.
LIST_TAGS_PATTERN = rf"^[^,\x00]{{1,100}}(,[^,\x00]{{0,100}}){{0,{MAX_TAGS - 1}}}$"


@extend_schema_field({"type": "string", "maxLength": 256, "pattern": LIST_TAGS_PATTERN})
class TagListField(StrictCharField):
    """One text for a query's tags, checked against its schema's pattern as the client sent it
    (StrictCharField: " ,x" and "U+001E,x" were checked as ",x", as Python's strip takes
    U+001E too). A blank `tags=` filters nothing (DRF returns it before the validators, the
    schema's other branch)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(self.match_pattern)

    @staticmethod
    def match_pattern(value: str) -> None:
        # fullmatch: Python's `$` also matches before a final newline, a JSON Schema's does not.
        if not re.fullmatch(LIST_TAGS_PATTERN, value):
            raise serializers.ValidationError(f"At most {MAX_TAGS} tags of 100 characters.")


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
            "position",
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
        extra_kwargs = {
            "position": {
                "help_text": "Its order within its session (0 first: the order the session's "
                "items were stored in, a batch's in the order given); null without a session."
            }
        }

    def to_representation(self, instance: MemoryItem) -> dict[str, Any]:
        # DRF built this ModelSerializer's fields from the model for every response and then
        # went field by field: about a tenth of a search's CPU (bench/web.py). The fields still
        # declare the shape and the schema; a test holds this to DRF's representation.
        return {
            "point_id": str(instance.id),
            "agent_id": instance.agent_id,
            "session_id": instance.session_id,
            "position": instance.position,
            "kind": instance.kind,
            "source": instance.source,
            "content": instance.content,
            "importance": instance.importance,
            "sensitivity": instance.sensitivity,
            "tags": instance.tags,
            "metadata": instance.metadata,
            "created_at": timestamp_out(instance.created_at),
            "expires_at": timestamp_out(instance.expires_at),
            "access_count": instance.access_count,
            "embedding_model": instance.embedding_model,
            "version": instance.version,
        }


class MemoryListQuerySerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256, required=False)
    session_id = StrictCharField(max_length=256, required=False)
    kind = serializers.ChoiceField(choices=MemoryItem.Kind.choices, required=False)
    # `source` is also a DRF Field attribute; as a declared field it is moved off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=MemoryItem.Source.choices, required=False
    )
    sensitivity = serializers.ChoiceField(choices=MemoryItem.Sensitivity.choices, required=False)
    # One comma-separated text, not a repeated parameter: in a query a list of one tag and a
    # plain value look alike, so a list's type could never be checked.
    # (256 like an id: a query line must fit gunicorn's limit_request_line, 4094 bytes.)
    tags = TagListField(
        max_length=256,
        required=False,
        allow_blank=True,
        help_text=f"Comma-separated tags (at most {MAX_TAGS}, each at most 100 characters): "
        "items with every one of them.",
    )
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)

    def validate_tags(self, value: str) -> list[str]:
        return [tag.strip() for tag in value.split(",") if tag.strip()]


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
    min_relevance = StrictFloatField(
        min_value=0,
        max_value=1,
        default=0.0,
        help_text="Leave out the hits whose relevance is below this (of the top `limit`).",
    )
    session_diversity = StrictFloatField(
        min_value=0,
        max_value=100,
        required=False,
        help_text="Hybrid only: each hit of a session ranked below another of that session "
        "loses this many standard deviations of the candidates' scores. Default "
        "MEMORY_SESSION_DIVERSITY (0.25), tuned for finding turns; about 1 spreads the top hits "
        "over as many sessions as are relevant (to find which conversations mention "
        "something); 0 ranks by relevance alone.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "session_diversity" in attrs and attrs["mode"] != "hybrid":
            raise serializers.ValidationError(
                {"session_diversity": "Only hybrid search ranks by session; leave it out."}
            )
        return attrs


RELEVANCE_HELP = (
    "0 to 1: how likely the item is about the query, from absolute evidence (the cosine of "
    "query and item embeddings, and the share of the query's words the item contains), "
    "comparable across queries, unlike `score`."
)


class MemoryHitSerializer(serializers.Serializer):
    score = serializers.FloatField(
        help_text=(
            "Higher ranks first. hybrid: the sum of the dense (whole text and best sentence, "
            "MEMORY_SENTENCE_WEIGHT) and BM25 z-scores among the candidates (can be negative), "
            "plus the neighbour context of an episodic item stored with a session "
            "(MEMORY_NEIGHBOUR_WEIGHT), less the session diversity's cost to a further hit of "
            "a session (session_diversity); dense: cosine similarity; "
            "sparse: BM25; with rerank: the cross-encoder's score."
        )
    )
    relevance = serializers.FloatField(help_text=RELEVANCE_HELP)
    item = MemoryOutSerializer()


class MemorySearchOutSerializer(serializers.Serializer):
    results = MemoryHitSerializer(many=True)


class MemoryContextSerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256)
    query = StrictCharField(max_length=MAX_CONTENT_CHARS)
    token_budget = StrictIntegerField(
        min_value=1,
        max_value=MAX_TOKEN_BUDGET,
        help_text="Most tokens the context may take (counted with CONTEXT_TOKENIZER).",
    )
    session_id = serializers.UUIDField(
        required=False,
        help_text="The session whose recent turns come first (a live session of this agent).",
    )
    recent_share = StrictFloatField(
        min_value=0,
        max_value=1,
        required=False,
        help_text=f"Share of the budget for the recent turns; default {DEFAULT_RECENT_SHARE}, "
        "or 1 - memory_share; give one of the two, not both (400). What one part leaves unused "
        "goes to the other.",
    )
    memory_share = StrictFloatField(
        min_value=0,
        max_value=1,
        required=False,
        help_text="Share of the budget for the memories; default 1 - recent_share.",
    )
    limit = serializers.IntegerField(
        min_value=1, max_value=100, default=10, help_text="Most memories to consider."
    )
    min_relevance = StrictFloatField(
        min_value=0,
        max_value=1,
        required=False,
        help_text="Memories below this relevance are left out. Default: CONTEXT_MIN_RELEVANCE.",
    )
    mode = serializers.ChoiceField(choices=MODES, default="hybrid")
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=MemoryItem.Kind.choices), default=list, max_length=4
    )
    tags = serializers.ListField(
        child=StrictCharField(max_length=100), default=list, max_length=MAX_TAGS
    )
    max_sensitivity = serializers.ChoiceField(
        choices=MemoryItem.Sensitivity.choices,
        default=MemoryItem.Sensitivity.PII,
        help_text="Only memories at most this sensitive (none < low < pii < sensitive). "
        "Default: pii, so `sensitive` ones stay out of a prompt unless asked for.",
    )
    recency_half_life = StrictFloatField(
        min_value=0,
        max_value=MAX_KEEP_SECONDS,
        default=0.0,
        help_text="Seconds: weigh each memory's relevance by 0.5^(age / half-life); 0: off.",
    )
    importance_weight = StrictFloatField(
        min_value=0,
        max_value=1,
        default=0.0,
        help_text="w: memories rank by (1 - w) * relevance * recency + w * importance.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        recent, memory = attrs.pop("recent_share", None), attrs.pop("memory_share", None)
        if recent is not None and memory is not None:
            # One share says the other (1 minus it); two could disagree, so the schema admits
            # one (`not` both) and the answer says why rather than guessing which one was meant.
            raise serializers.ValidationError(
                {
                    "memory_share": [
                        "Give recent_share or memory_share, not both: the other is 1 minus it."
                    ]
                }
            )
        if recent is None:
            recent = DEFAULT_RECENT_SHARE if memory is None else 1 - memory
        attrs["recent_share"] = recent
        attrs["session_id"] = str(attrs["session_id"]) if "session_id" in attrs else ""
        return attrs


class ContextMemorySerializer(serializers.Serializer):
    item = MemoryOutSerializer(source="hit.item")
    score = serializers.FloatField(source="hit.score", help_text="The search's score.")
    relevance = serializers.FloatField(source="hit.relevance", help_text=RELEVANCE_HELP)
    tokens = serializers.IntegerField(help_text="Tokens of its line in `context`.")


class ContextTurnSerializer(serializers.Serializer):
    role = serializers.CharField()
    content = serializers.CharField()
    name = serializers.CharField(required=False)
    at = serializers.CharField(required=False)


class ContextDroppedSerializer(serializers.Serializer):
    turns = serializers.IntegerField(help_text="The session's turns not in the context.")
    memories = serializers.IntegerField(
        help_text="Relevant memories left out: no room in the budget, or repeating a turn."
    )


class MemoryContextOutSerializer(serializers.Serializer):
    # Serializer.context is moved off the class by DRF's metaclass, as `source` is above.
    context = serializers.CharField(  # type: ignore[assignment]
        help_text="Prompt-ready text: a '## Recent turns' section (oldest first) and a "
        "'## Relevant memories' section (each '- [date, kind] content'), each only when it has "
        "anything; empty when nothing fits."
    )
    recent_turns = ContextTurnSerializer(many=True)
    memories = ContextMemorySerializer(many=True, help_text="In the context's order: by rank.")
    tokens_used = serializers.IntegerField(help_text="Tokens of `context`; never over the budget.")
    token_budget = serializers.IntegerField()
    dropped = ContextDroppedSerializer()
    degraded = serializers.ListField(
        child=serializers.ChoiceField(choices=["working_memory", "vector_index"]),
        help_text="Parts left out because their backend is down; the rest still answers.",
    )
