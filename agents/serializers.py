from rest_framework import serializers

from ferrum_memory.core.fields import StrictCharField


class AgentPathSerializer(serializers.Serializer):
    agent_id = StrictCharField(max_length=256)


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
