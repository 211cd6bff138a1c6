import uuid

from django.db import models
from django.db.models import Q

from ferrum_memory.core.models import Tombstone

# The revision counter of every write the vector index follows (ferrum_memory.core.revisions).
REVISION = "memory"


class MemoryItem(models.Model):
    """A long-term memory item. The DB row is the truth; vector indexes are derived from it.

    It keeps its own embedding and the model that made it, so an index can be rebuilt without
    re-embedding and a model change is detected instead of mixing two vector spaces.
    """

    class Kind(models.TextChoices):
        EPISODIC = "episodic"
        SEMANTIC = "semantic"
        PROCEDURAL = "procedural"
        SESSION_SUMMARY = "session_summary"

    class Source(models.TextChoices):
        AGENT = "agent"
        USER = "user"
        TOOL = "tool"
        CONSOLIDATION = "consolidation"
        IMPORT = "import"

    class Sensitivity(models.TextChoices):
        """Ordered from least to most sensitive: a reader's `max_sensitivity` admits a level
        and every level before it."""

        NONE = "none"
        LOW = "low"
        PII = "pii"
        SENSITIVE = "sensitive"

    # Also the Qdrant point id.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent_id = models.CharField(max_length=256)
    session_id = models.CharField(max_length=256, blank=True, default="")
    # Its order within its session (0, 1, ...: the order the session's items were stored in,
    # a batch's in the order given); null without a session. The search's neighbour context
    # reads it: the items before and after a turn are the conversation around it.
    position = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.EPISODIC)
    source = models.CharField(max_length=20, choices=Source.choices, default=Source.AGENT)
    content = models.TextField()
    # sha256 of the normalised content: exact duplicates of an agent are found by index.
    content_hash = models.CharField(max_length=64)
    importance = models.FloatField(default=0.5)
    sensitivity = models.CharField(
        max_length=20, choices=Sensitivity.choices, default=Sensitivity.NONE
    )
    tags = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    access_count = models.PositiveIntegerField(default=0)
    last_accessed_at = models.DateTimeField(null=True, blank=True)
    embedding = models.BinaryField()  # float32, little-endian, L2-normalised
    # Its sentences' vectors as `embedding`'s, one after another, when the content has two or
    # more (memory.embeddings.sentences); empty otherwise. Hybrid search scores an item by its
    # best sentence too; kept here so that an index rebuild embeds nothing.
    sentence_embeddings = models.BinaryField(blank=True, default=b"")
    # Its word pieces' vectors (memory.embeddings.token_blob: int8, `embedding`'s width, one
    # after another), from the pass that made `embedding`: hybrid search's late interaction
    # scores an item by them. Empty for an item stored before items kept them, until
    # `manage.py memory_reindex` fills them in.
    token_embeddings = models.BinaryField(blank=True, default=b"")
    embedding_model = models.CharField(max_length=200)
    # Of the "memory" revision counter: the write that last changed what the index holds.
    revision = models.BigIntegerField(db_index=True)
    # Every change a client or a merge makes adds one: PATCH's optimistic concurrency.
    version = models.PositiveIntegerField(default=1)

    class Meta:
        indexes = [
            models.Index(fields=["agent_id", "content_hash"], name="memory_agent_hash"),
            models.Index(fields=["agent_id", "-created_at"], name="memory_agent_recent"),
            models.Index(fields=["expires_at"], name="memory_expires"),
            models.Index(
                fields=["agent_id", "session_id", "position"], name="memory_session_position"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(importance__gte=0) & Q(importance__lte=1), name="memory_importance_0_1"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}: {self.content[:60]}"


SENSITIVITY_LEVELS = [level for level, _ in MemoryItem.Sensitivity.choices]


def sensitivity_rank(level: str) -> int:
    """0 for none, up to 3 for sensitive: what the vector index filters on."""
    return SENSITIVITY_LEVELS.index(level)


class MemoryTombstone(Tombstone):
    """A deleted memory item, kept until every vector index has had time to drop it."""

    revision_counter = REVISION

    point_id = models.UUIDField(primary_key=True)


class MemoryEvent(models.Model):
    """One change of a memory item, its history. Not a foreign key: the history of an item
    outlives it (GET /memory/{point_id}/history after a delete); an erasure removes it."""

    class Kind(models.TextChoices):
        CREATED = "created"
        CONSOLIDATED = "consolidated", "created by a session's consolidation"
        UPDATED = "updated"
        MERGED_FROM = "merged_from", "another memory was merged into it"
        MERGED_INTO = "merged_into", "merged into another memory, and so deleted"
        DELETED = "deleted"
        EXPIRED = "expired"

    point_id = models.UUIDField()
    agent_id = models.CharField(max_length=256)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    at = models.DateTimeField()
    # The API key's name, "admin:<username>", or "" for the service itself (expiry).
    actor = models.CharField(max_length=200, blank=True, default="")
    # The item's version after the change; null once it is gone.
    version = models.PositiveIntegerField(null=True, blank=True)
    # {field: {"before": ..., "after": ...}} of what changed.
    changes = models.JSONField(default=dict, blank=True)
    # The memory merged into this one (merged_from) or this one was merged into (merged_into).
    other_point_id = models.UUIDField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["point_id", "id"], name="memory_event_point"),
            models.Index(fields=["agent_id"], name="memory_event_agent"),
        ]

    def __str__(self) -> str:
        return f"{self.point_id} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"


class VectorIndexCursor(models.Model):
    """How far a shared vector index (a Qdrant server collection) has applied the DB.

    An embedded qdrant-edge shard keeps the same two facts in a file beside itself."""

    name = models.CharField(max_length=300, primary_key=True)
    cursor = models.BigIntegerField(default=-1)
    embedding_model = models.CharField(max_length=200, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.name}@{self.cursor}"


class WordPieceCounts(models.Model):
    """How many memory items hold each word piece of an embedding model's vocabulary: the
    document frequencies by which hybrid search weighs a query's tokens (their IDF, as BM25
    weighs its terms). Derived from the items' texts, like the index, and counted again by
    memory_count_word_pieces when the items have changed; one row per model."""

    embedding_model = models.CharField(max_length=200, primary_key=True)
    items = models.PositiveIntegerField()
    # One little-endian int32 per word piece id, the vocabulary's size in all.
    counts = models.BinaryField()
    revision = models.BigIntegerField(help_text="The memory revision the count is of.")
    counted_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.embedding_model}: {self.items} items at revision {self.revision}"
