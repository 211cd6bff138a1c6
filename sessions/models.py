import uuid

from django.db import models
from django.db.models import Q


class Session(models.Model):
    """An agent's working-memory session. Its state lives in the working-memory store (Redis, or
    WorkingMemoryEntry when embedded); this row is the durable record: status, times, the
    version last written and last consolidated, and the summary item consolidation made."""

    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"
        EXPIRED = "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent_id = models.CharField(max_length=256)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    ttl_seconds = models.PositiveIntegerField()
    # Mirrors the store's version on every update, so the idle sweep needs no store read.
    version = models.PositiveIntegerField(default=1)
    consolidated_version = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    last_activity_at = models.DateTimeField()
    # last_activity_at + ttl, and the point (SESSION_IDLE_FRACTION of the TTL) from which the
    # beat consolidates an idle session before the store forgets it.
    expires_at = models.DateTimeField()
    consolidate_after = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    summary_item = models.ForeignKey(
        "memory.MemoryItem", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        indexes = [
            models.Index(fields=["status", "consolidate_after"], name="session_idle"),
            models.Index(fields=["status", "expires_at"], name="session_expiry"),
            models.Index(fields=["agent_id", "-started_at"], name="session_agent_recent"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(consolidated_version__lte=models.F("version")),
                name="session_consolidated_le_version",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}/{self.pk} ({self.status})"


class WorkingMemoryEntry(models.Model):
    """The embedded working-memory store (no REDIS_URL): one row per live session state.

    Same behaviour as the Redis store: an entry past expires_at is gone for readers, and the
    beat deletes it."""

    session_id = models.UUIDField(primary_key=True)
    agent_id = models.CharField(max_length=256)
    state = models.JSONField()
    version = models.PositiveIntegerField()
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.session_id}@{self.version}"


class Consolidation(models.Model):
    """One consolidation of one session state, (session, version) unique: the exactly-once key.

    The state is snapshotted here when the consolidation is asked for (close, compress, idle
    sweep), so the worker needs neither Redis nor the TTL; the snapshot is dropped when done."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="consolidations")
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    reason = models.CharField(max_length=10)  # close, compress or idle
    task_id = models.CharField(max_length=64)
    state = models.JSONField(null=True, blank=True)
    # A claim: who runs it and until when; a claim past its lease may be taken over.
    claim_token = models.CharField(max_length=32, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    summary_item = models.ForeignKey(
        "memory.MemoryItem", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    memory_item_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "version"], name="consolidation_once"),
        ]
        indexes = [models.Index(fields=["status", "created_at"], name="consolidation_status")]

    def __str__(self) -> str:
        return f"{self.session_id}@{self.version} ({self.status})"
