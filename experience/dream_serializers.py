"""Input validation and output shapes of the dream-cycle API (the learner hand-off)."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ferrum_memory.core.fields import StrictCharField, StrictFloatField, StrictIntegerField

from .models import DreamCycle, DreamCycleItem
from .serializers import MAX_REPLAY_BATCH, ExperienceOutSerializer

MAX_LEASE_SECONDS = 86_400


class DreamCycleListQuerySerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256, required=False)
    status = serializers.ChoiceField(choices=DreamCycle.Status.choices, required=False)


class DreamCycleSerializer(serializers.ModelSerializer):
    item_count = serializers.IntegerField(read_only=True, help_text="Draws in the batch.")

    class Meta:
        model = DreamCycle
        fields = [
            "id",
            "agent_id",
            "number",
            "status",
            "strategy",
            "alpha",
            "beta",
            "seed",
            "buffer_size",
            "item_count",
            "created_at",
            "claimed_by",
            "claimed_at",
            "lease_until",
            "claim_count",
            "completed_at",
        ]


class DreamCycleItemSerializer(serializers.ModelSerializer):
    experience = serializers.SerializerMethodField(
        help_text="The experience as stored now; null once it has been deleted."
    )

    class Meta:
        model = DreamCycleItem
        fields = [
            "position",
            "experience_id",
            "probability",
            "weight",
            "td_error_before",
            "td_error_after",
            "experience",
        ]

    @extend_schema_field(ExperienceOutSerializer(allow_null=True))
    def get_experience(self, item: DreamCycleItem) -> dict[str, Any] | None:
        # The view reads the cycle's experiences in one query and passes them in the context.
        experience = self.context["experiences"].get(item.experience_pk)
        return None if experience is None else ExperienceOutSerializer(experience).data


class DreamCycleDetailSerializer(DreamCycleSerializer):
    items = DreamCycleItemSerializer(many=True, read_only=True)

    class Meta(DreamCycleSerializer.Meta):
        fields = [*DreamCycleSerializer.Meta.fields, "items"]


class DreamCycleClaimedSerializer(DreamCycleDetailSerializer):
    lease_token = serializers.CharField(
        read_only=True, help_text="Send it back with the TD errors; only this claim may."
    )

    class Meta(DreamCycleDetailSerializer.Meta):
        fields = [*DreamCycleDetailSerializer.Meta.fields, "lease_token"]


class DreamClaimSerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256)
    learner = StrictCharField(
        max_length=256, required=False, help_text="Who claims; default: the API key's name."
    )
    lease_seconds = StrictIntegerField(
        min_value=1,
        max_value=MAX_LEASE_SECONDS,
        required=False,
        help_text="How long the claim holds; default DREAM_LEASE_SECONDS.",
    )


class DreamTdErrorSerializer(serializers.Serializer):
    experience_id = StrictCharField(max_length=256)
    td_error = StrictFloatField()


class DreamTdErrorReportSerializer(serializers.Serializer):
    lease_token = StrictCharField(max_length=64)
    td_errors = DreamTdErrorSerializer(  # type: ignore[call-arg]  # max_length: list kwarg
        many=True, allow_empty=False, max_length=MAX_REPLAY_BATCH
    )


class DreamCompletionSerializer(serializers.Serializer):
    cycle = DreamCycleSerializer()
    updated = serializers.IntegerField(help_text="Experiences whose priority changed.")
    unknown_ids = serializers.ListField(
        child=serializers.CharField(), help_text="Experiences deleted since the draw."
    )
