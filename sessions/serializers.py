"""Input validation and output shapes for the session API (WorkingMemoryState, consolidations)."""

from typing import Any

from rest_framework import serializers

from ferrum_memory.core.fields import (
    MAX_COUNT,
    StrictCharField,
    StrictIntegerField,
    json_size_validator,
)

from .models import Consolidation, Session

MAX_TEXT_CHARS = 100_000
MAX_TASK_CHARS = 20_000
MAX_FACTS = 1_000
MAX_FACT_CHARS = 2_000
MAX_MESSAGES_PER_REQUEST = 1_000
MAX_TOOL_STATE_BYTES = 256_000
MAX_METADATA_BYTES = 64_000
MAX_TTL_SECONDS = 30 * 86_400
ROLES = ("user", "assistant", "system", "tool")


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES)
    content = StrictCharField(max_length=MAX_TEXT_CHARS, allow_blank=True, trim_whitespace=False)
    name = StrictCharField(
        max_length=256, required=False, allow_blank=True, help_text="The speaker or tool."
    )
    at = StrictCharField(
        max_length=64, required=False, allow_blank=True, help_text="When it was said, as written."
    )


class StateFieldsSerializer(serializers.Serializer):
    """The fields of a working-memory state a client sets (each replaces the stored value)."""

    task = StrictCharField(max_length=MAX_TASK_CHARS, required=False, allow_blank=True)
    scratchpad = StrictCharField(
        max_length=MAX_TEXT_CHARS, required=False, allow_blank=True, trim_whitespace=False
    )
    facts = serializers.ListField(
        child=StrictCharField(max_length=MAX_FACT_CHARS),
        max_length=MAX_FACTS,
        required=False,
    )
    tool_state = serializers.DictField(
        required=False, validators=[json_size_validator(MAX_TOOL_STATE_BYTES)]
    )
    step = StrictIntegerField(min_value=0, max_value=MAX_COUNT, required=False)
    outcome = StrictCharField(max_length=MAX_FACT_CHARS, required=False, allow_blank=True)
    metadata = serializers.DictField(
        required=False, validators=[json_size_validator(MAX_METADATA_BYTES)]
    )


class SessionStartSerializer(StateFieldsSerializer):
    agent_id = StrictCharField(max_length=256)
    ttl_seconds = StrictIntegerField(
        min_value=1,
        max_value=MAX_TTL_SECONDS,
        required=False,
        help_text="Seconds the working memory lives after its last update. "
        "Default: DEFAULT_WORKING_MEM_TTL.",
    )
    messages = serializers.ListField(
        child=MessageSerializer(), required=False, max_length=MAX_MESSAGES_PER_REQUEST
    )


class SessionUpdateSerializer(StateFieldsSerializer):
    version = StrictIntegerField(
        min_value=1, max_value=MAX_COUNT, help_text="The version read last; a stale one gets 409."
    )
    append_messages = serializers.ListField(
        child=MessageSerializer(), required=False, max_length=MAX_MESSAGES_PER_REQUEST
    )

    def fields_to_set(self) -> dict[str, Any]:
        data = dict(self.validated_data)
        data.pop("version")
        data.pop("append_messages", None)
        return data


class SessionIdSerializer(serializers.Serializer):
    session_id = serializers.UUIDField()


class WorkingMemoryStateSerializer(serializers.Serializer):
    session_id = serializers.UUIDField()
    agent_id = serializers.CharField()
    task = serializers.CharField()
    messages = MessageSerializer(many=True)
    scratchpad = serializers.CharField()
    facts = serializers.ListField(child=serializers.CharField())
    tool_state = serializers.DictField()
    step = serializers.IntegerField()
    outcome = serializers.CharField()
    metadata = serializers.DictField()
    version = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    status = serializers.ChoiceField(choices=Session.Status.choices, default="open")


class ConsolidationSerializer(serializers.ModelSerializer):
    consolidation_id = serializers.IntegerField(source="id")
    session_id = serializers.UUIDField()
    agent_id = serializers.CharField(source="session.agent_id")
    summary_item_id = serializers.UUIDField(allow_null=True)
    summary = serializers.CharField(source="summary_item.content", allow_null=True, default=None)
    memory_item_ids = serializers.ListField(child=serializers.UUIDField())

    class Meta:
        model = Consolidation
        fields = [
            "consolidation_id",
            "session_id",
            "agent_id",
            "version",
            "status",
            "reason",
            "task_id",
            "summary_item_id",
            "summary",
            "memory_item_ids",
            "attempts",
            "created_at",
            "finished_at",
        ]
