from django.db import models


class AgentErasure(models.Model):
    """What is left of an erased agent: who erased it, when, and how many rows of each kind
    went. No content."""

    agent_id = models.CharField(max_length=256, db_index=True)
    erased_at = models.DateTimeField()
    # The API key's name, or "admin:<username>".
    actor = models.CharField(max_length=200, blank=True, default="")
    counts = models.JSONField(default=dict)

    class Meta:
        ordering = ["-erased_at", "-id"]

    def __str__(self) -> str:
        return f"{self.agent_id} erased at {self.erased_at:%Y-%m-%d %H:%M:%S}"
