import base64
import binascii

import numpy as np
from rest_framework import serializers

from experience.models import DreamCycle
from experience.serializers import MAX_REPLAY_BATCH, STRATEGIES
from ferrum_memory.core.fields import (
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    json_size_validator,
)
from memory.models import MemoryEvent, MemoryItem
from memory.serializers import MAX_CONTENT_CHARS, MAX_TAGS
from sessions.serializers import MAX_TTL_SECONDS


class AgentPathSerializer(serializers.Serializer):
    # Not trimmed: a path is the id as it is, and its length is the schema's maxLength.
    agent_id = StrictCharField(max_length=256, trim_whitespace=False)


class ErasureCountsSerializer(serializers.Serializer):
    sessions = serializers.IntegerField(help_text="Sessions, each with its working memory.")
    consolidations = serializers.IntegerField()
    memory_items = serializers.IntegerField()
    memory_events = serializers.IntegerField(help_text="History events of the memory items.")
    experiences = serializers.IntegerField()
    dream_cycles = serializers.IntegerField()
    dream_cycle_items = serializers.IntegerField(help_text="The dream cycles' draws.")


class AgentErasureSerializer(serializers.Serializer):
    agent_id = serializers.CharField(source="record.agent_id")
    erased_at = serializers.DateTimeField(source="record.erased_at")
    actor = serializers.CharField(source="record.actor", help_text="The API key's name.")
    counts = ErasureCountsSerializer(source="record.counts", help_text="Rows deleted, by kind.")
    erased_now = serializers.BooleanField(
        help_text="False when there was nothing left: the answer is the last erasure record."
    )


# The lines of an export file, as an import reads them -----------------------------------


class HeaderLineSerializer(serializers.Serializer):
    format = serializers.ChoiceField(choices=["ferrum-memory-agent"])
    version = serializers.ChoiceField(choices=[1])
    agent_id = StrictCharField(max_length=256)
    embedding_model = StrictCharField(max_length=200)
    embedding_dim = StrictIntegerField(min_value=1, max_value=65_536)


class MemoryLineSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    session_id = StrictCharField(max_length=256, allow_blank=True, default="")
    # Absent from an export made before items had positions: null, no neighbour context.
    position = StrictIntegerField(min_value=0, max_value=2**31 - 1, allow_null=True, default=None)
    kind = serializers.ChoiceField(choices=MemoryItem.Kind.choices)
    # `source` is also a DRF Field attribute; as a declared field it is moved off the class.
    source = serializers.ChoiceField(choices=MemoryItem.Source.choices)  # type: ignore[assignment]
    content = StrictCharField(max_length=MAX_CONTENT_CHARS, trim_whitespace=False)
    importance = StrictFloatField(min_value=0, max_value=1)
    sensitivity = serializers.ChoiceField(
        choices=MemoryItem.Sensitivity.choices, default=MemoryItem.Sensitivity.NONE
    )
    tags = serializers.ListField(child=StrictCharField(max_length=100), max_length=MAX_TAGS)
    metadata = serializers.DictField(validators=[json_size_validator(64_000)])
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    access_count = StrictIntegerField(min_value=0, max_value=2**31 - 1, default=0)
    last_accessed_at = serializers.DateTimeField(allow_null=True, default=None)
    version = StrictIntegerField(min_value=1, max_value=2**31 - 1, default=1)
    embedding_model = StrictCharField(max_length=200)
    embedding = StrictCharField(max_length=1_000_000)
    # Absent from an export made before items kept them: embedded again on import.
    sentence_embeddings = StrictCharField(
        max_length=40_000_000, allow_blank=True, required=False, trim_whitespace=False
    )

    token_embeddings = StrictCharField(
        max_length=40_000_000, allow_blank=True, required=False, trim_whitespace=False
    )

    def validate_embedding(self, value: str) -> bytes:
        raw = _float32s(value)
        if not raw:
            raise serializers.ValidationError("Not a vector of finite float32 numbers.")
        return raw

    def validate_sentence_embeddings(self, value: str) -> bytes:
        return _float32s(value)

    def validate_token_embeddings(self, value: str) -> bytes:
        return _base64(value)


def _base64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise serializers.ValidationError("Not base64.") from None


def _float32s(value: str) -> bytes:
    """Base64 of finite little-endian float32 numbers, decoded (b"" for "")."""
    raw = _base64(value)
    vector = np.frombuffer(raw, dtype="<f4") if len(raw) % 4 == 0 else None
    if vector is None or not np.isfinite(vector).all():
        raise serializers.ValidationError("Not finite float32 numbers.")
    return raw


class MemoryEventLineSerializer(serializers.Serializer):
    point_id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=MemoryEvent.Kind.choices)
    at = serializers.DateTimeField()
    actor = StrictCharField(max_length=200, allow_blank=True, trim_whitespace=False)
    version = StrictIntegerField(min_value=1, max_value=2**31 - 1, allow_null=True)
    changes = serializers.DictField(validators=[json_size_validator(1_000_000)])
    other_point_id = serializers.UUIDField(allow_null=True)


class ExperienceExtraLineSerializer(serializers.Serializer):
    """What an experience line has beyond POST /experience/'s fields."""

    priority = StrictFloatField(min_value=0)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    times_sampled = StrictIntegerField(min_value=0, max_value=2**31 - 1, default=0)
    last_sampled_at = serializers.DateTimeField(allow_null=True, default=None)


class SessionLineSerializer(serializers.Serializer):
    session_id = serializers.UUIDField()
    ttl_seconds = StrictIntegerField(min_value=1, max_value=MAX_TTL_SECONDS)
    state = serializers.DictField()


class DrawLineSerializer(serializers.Serializer):
    position = StrictIntegerField(min_value=0, max_value=2**31 - 1)
    experience_id = StrictCharField(max_length=256)
    probability = StrictFloatField(min_value=0, max_value=1)
    weight = StrictFloatField(min_value=0)
    td_error_before = StrictFloatField(allow_null=True)
    td_error_after = StrictFloatField(allow_null=True)


class DreamCycleLineSerializer(serializers.Serializer):
    number = StrictIntegerField(min_value=1, max_value=2**31 - 1)
    status = serializers.ChoiceField(choices=DreamCycle.Status.choices)
    strategy = serializers.ChoiceField(choices=STRATEGIES)
    alpha = StrictFloatField(min_value=0)
    beta = StrictFloatField(min_value=0, max_value=1)
    seed = StrictIntegerField(min_value=-(2**63), max_value=2**63 - 1)
    buffer_size = StrictIntegerField(min_value=0, max_value=2**31 - 1)
    created_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)
    items = DrawLineSerializer(many=True, max_length=MAX_REPLAY_BATCH)  # type: ignore[call-arg]


class ImportCountsSerializer(serializers.Serializer):
    memory_items = serializers.IntegerField()
    memory_events = serializers.IntegerField()
    experiences = serializers.IntegerField()
    sessions = serializers.IntegerField()
    dream_cycles = serializers.IntegerField()


class AgentImportSerializer(serializers.Serializer):
    agent_id = serializers.CharField()
    imported = ImportCountsSerializer(help_text="Rows written, by kind.")
    skipped = ImportCountsSerializer(help_text="Rows the agent already had (same id): kept.")
    reembedded = serializers.IntegerField(
        help_text="Memory items embedded again: the file's model is not the configured one."
    )
