from typing import ClassVar

from django.db import models


class ApiKey(models.Model):
    """A client's credential. Only a hash of the key is stored; the key is shown once."""

    name = models.CharField(max_length=100)
    # The first characters of the key, kept in clear so people can tell keys apart.
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    allowed_agent_ids = models.JSONField(
        default=list, blank=True, help_text="Agent ids this key may use; empty means every agent."
    )
    read_only = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_authenticated(self) -> bool:
        # DRF puts the authenticated principal in request.user; an API key is that principal.
        return True


class RevisionCounter(models.Model):
    """A named, monotonic change counter: the cursor that derived indexes catch up from.

    A write transaction takes one revision by incrementing this row. The row stays locked until
    the transaction commits, so revisions become visible in the order they were handed out: a
    reader that has seen revision r has seen every revision below r (the commit-safe horizon).
    """

    name = models.CharField(max_length=50, primary_key=True)
    value = models.BigIntegerField(default=0)
    # Tombstones up to this revision have been purged: an index whose cursor is older than this
    # cannot catch up by reading changes and must rebuild from the DB.
    purged_through = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}@{self.value}"


class Tombstone(models.Model):
    """A deleted row, kept until every derived index has had time to drop it (abstract).

    A concrete tombstone declares its primary key (the deleted row's) and `revision_counter`,
    the name of the counter its app's writes take: the one place that name is written."""

    revision_counter: ClassVar[str]

    agent_id = models.CharField(max_length=256)
    revision = models.BigIntegerField(db_index=True)
    deleted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"tombstone {self.pk}@{self.revision}"
