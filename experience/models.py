from django.db import models
from django.db.models import Q


class Experience(models.Model):
    """One experience tuple (task, tool_calls, test_result, reward) in the replay buffer.

    The DB is the truth; every process's replay index is derived from it through `revision`.
    """

    # The replay index is keyed by this integer; clients see `experience_id`.
    id = models.BigAutoField(primary_key=True)
    experience_id = models.CharField(max_length=256, unique=True)
    agent_id = models.CharField(max_length=256)
    session_id = models.CharField(max_length=256, blank=True, default="")
    task = models.TextField()
    tool_calls = models.JSONField(default=list, blank=True)
    test_result = models.JSONField(null=True, blank=True)
    # test_result.passed, kept as a column so filters and the pass rate need no JSON query.
    passed = models.BooleanField(null=True, blank=True)
    reward = models.FloatField()
    td_error = models.FloatField(null=True, blank=True)
    # The sampling weight under the configured alpha: (|td_error| + eps) ** alpha, the max
    # priority for an item with no TD error yet, or what a curator set in the admin.
    priority = models.FloatField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    times_sampled = models.PositiveIntegerField(default=0)
    last_sampled_at = models.DateTimeField(null=True, blank=True)
    # Of the "experience" revision counter: the write that last changed what sampling reads.
    revision = models.BigIntegerField(db_index=True)

    class Meta:
        indexes = [
            models.Index(fields=["agent_id", "-id"], name="experience_agent_recent"),
            models.Index(fields=["agent_id", "priority"], name="experience_agent_priority"),
            models.Index(fields=["expires_at"], name="experience_expires"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(priority__gte=0), name="experience_priority_gte_0"),
        ]

    def __str__(self) -> str:
        return self.experience_id


class ExperienceTombstone(models.Model):
    """A deleted experience, kept until every replay index has had time to drop it."""

    experience_pk = models.BigIntegerField(primary_key=True)
    agent_id = models.CharField(max_length=256)
    revision = models.BigIntegerField(db_index=True)
    deleted_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"tombstone {self.experience_pk}@{self.revision}"
