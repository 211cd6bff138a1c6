from django.db import models
from django.db.models import Q

from ferrum_memory.core.models import Tombstone

# The revision counter of every write the replay index follows (ferrum_memory.core.revisions).
REVISION = "experience"


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
    # Set when the item was drawn its agent's max_times_sampled times: no replay draws it
    # again, and the purge deletes it.
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["agent_id", "-id"], name="experience_agent_recent"),
            models.Index(fields=["agent_id", "priority"], name="experience_agent_priority"),
            models.Index(fields=["expires_at"], name="experience_expires"),
            models.Index(fields=["retired_at"], name="experience_retired"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(priority__gte=0), name="experience_priority_gte_0"),
        ]

    def __str__(self) -> str:
        return self.experience_id


class ExperienceTombstone(Tombstone):
    """A deleted experience, kept until every replay index has had time to drop it."""

    revision_counter = REVISION

    experience_pk = models.BigIntegerField(primary_key=True)


class ReplaySettings(models.Model):
    """One agent's replay controls; an agent without a row has the REPLAY_* defaults."""

    class Remover(models.TextChoices):
        FIFO = "fifo", "oldest first"
        LOWEST_PRIORITY = "lowest_priority", "lowest priority first"

    agent_id = models.CharField(max_length=256, primary_key=True)
    max_size = models.PositiveBigIntegerField(help_text="Capacity; 0: none.")
    remover = models.CharField(max_length=16, choices=Remover.choices)
    max_times_sampled = models.PositiveIntegerField(
        help_text="An item drawn this many times is retired; 0: no cap."
    )
    min_size = models.PositiveBigIntegerField(
        help_text="The rate limiter grants no draw before the agent holds this many items."
    )
    samples_per_insert = models.FloatField(help_text="The rate limiter's ratio; 0: no limiter.")
    spi_tolerance = models.FloatField(help_text="Draws the limiter may grant ahead of the ratio.")
    alpha = models.FloatField(help_text="The default PER exponent of this agent's replay.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "replay settings"
        verbose_name_plural = "replay settings"
        constraints = [
            models.CheckConstraint(
                condition=Q(samples_per_insert__gte=0, spi_tolerance__gte=0, alpha__gte=0),
                name="replay_settings_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return self.agent_id


class ReplayState(models.Model):
    """An agent's replay counters, shared by every process: kept in the transactions that
    insert, delete and (with the rate limiter) draw, so the limiter reads exact figures."""

    agent_id = models.CharField(max_length=256, primary_key=True)
    size = models.BigIntegerField(default=0, help_text="Experiences in the DB, retired included.")
    inserts = models.BigIntegerField(default=0, help_text="New experiences ever stored.")
    samples = models.BigIntegerField(default=0, help_text="Draws the rate limiter granted.")
    removals = models.BigIntegerField(default=0, help_text="Experiences evicted at capacity.")
    retired = models.BigIntegerField(default=0, help_text="Experiences retired by the cap.")

    def __str__(self) -> str:
        return f"{self.agent_id}: {self.size} items"


class ReplaySnapshot(models.Model):
    """An agent's counters at one moment, recorded by the beat for the dashboard's history."""

    agent_id = models.CharField(max_length=256)
    at = models.DateTimeField()
    size = models.BigIntegerField()
    inserts = models.BigIntegerField()
    samples = models.BigIntegerField()
    removals = models.BigIntegerField()
    retired = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["agent_id", "at"], name="replay_snapshot_agent_at")]

    def __str__(self) -> str:
        return f"{self.agent_id} at {self.at}"


class DreamCycle(models.Model):
    """One replay batch drawn on schedule for an agent, handed to a learner over the API.

    pending -> claimed (a learner holds a lease) -> completed (it reported TD errors). A claim
    whose lease ran out may be taken over by another learner.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        CLAIMED = "claimed"
        COMPLETED = "completed"

    agent_id = models.CharField(max_length=256)
    # The agent's cycle count, from 1: beta is annealed along it.
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    strategy = models.CharField(max_length=16)
    alpha = models.FloatField()
    beta = models.FloatField()
    # The seed of the draw and the buffer size it was drawn from, to explain a batch later.
    seed = models.BigIntegerField()
    buffer_size = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=256, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # A new random token per claim: only the current holder of the lease may complete it.
    lease_token = models.CharField(max_length=64, blank=True, default="", editable=False)
    claim_count = models.PositiveIntegerField(default=0)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["agent_id", "status", "id"], name="dream_agent_status")]
        constraints = [
            models.UniqueConstraint(fields=["agent_id", "number"], name="dream_agent_number"),
            models.CheckConstraint(condition=Q(beta__gte=0, beta__lte=1), name="dream_beta_0_1"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} #{self.number}"


class DreamCycleItem(models.Model):
    """One draw of a cycle. Sampling is with replacement, so an experience may appear twice."""

    cycle = models.ForeignKey(DreamCycle, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    # Not a foreign key: the history of a cycle outlives the experiences the TTL purges, and
    # purging stays a fast bulk delete with no related rows to visit.
    experience_pk = models.BigIntegerField(db_index=True)
    experience_id = models.CharField(max_length=256)
    probability = models.FloatField()
    weight = models.FloatField(help_text="Importance-sampling weight, max-normalised.")
    td_error_before = models.FloatField(null=True, blank=True)
    td_error_after = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["cycle", "position"]
        constraints = [
            models.UniqueConstraint(fields=["cycle", "position"], name="dream_item_position"),
        ]

    def __str__(self) -> str:
        return f"{self.cycle} [{self.position}] {self.experience_id}"


class DreamLock(models.Model):
    """A named lease in the DB so that two dream runs never overlap, across processes and
    machines; it expires on its own if its holder dies. (The file cache of the embedded mode
    has no atomic add, so a cache lock would not be safe there.)"""

    name = models.CharField(max_length=50, primary_key=True)
    holder = models.CharField(max_length=64, blank=True, default="")
    until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} until {self.until}"
