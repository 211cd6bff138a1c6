"""Typed results of the service's operations, as /openapi.json describes them.

Each model allows fields it does not name (`extra="allow"`): a newer service may answer more than
this client knows, and an older client must keep working with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MemoryKind = Literal["episodic", "semantic", "procedural", "session_summary"]
MemorySource = Literal["agent", "user", "tool", "consolidation", "import"]
SearchMode = Literal["hybrid", "dense", "sparse"]
Sensitivity = Literal["none", "low", "pii", "sensitive"]
ReplayStrategy = Literal["prioritized", "recency", "uniform"]
Role = Literal["system", "user", "assistant", "tool"]


class Model(BaseModel):
    model_config = ConfigDict(extra="allow")


# Inputs that nest (the service validates them; these give an IDE the field names) ----------------


class ToolCall(Model):
    name: str
    arguments: Any = None
    output: Any = None
    error: str | None = None
    duration_ms: float | None = None


class TestResult(Model):
    __test__ = False  # not a pytest test class, whatever its name
    passed: bool
    total: int | None = None
    failed: int | None = None
    errors: int | None = None
    output: str | None = None
    duration_ms: float | None = None


class Message(Model):
    role: Role
    content: str
    name: str | None = None
    at: datetime | None = None


class TdError(Model):
    experience_id: str
    td_error: float


# Service -------------------------------------------------------------------------------------


class BackendStatus(Model):
    status: str
    error: str | None = None


class Health(Model):
    status: str
    failed: list[str]
    backends: dict[str, Any]


# Long-term memory ----------------------------------------------------------------------------


class MemoryItem(Model):
    point_id: str
    agent_id: str
    session_id: str | None = None
    kind: str = "episodic"
    source: str = "agent"
    content: str
    importance: float = 0.5
    sensitivity: str = "none"
    position: int | None = None  # order within its session (None: no session)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    expires_at: datetime | None = None
    access_count: int = 0
    embedding_model: str
    version: int = 1  # what memory_update's `version` must name


class MemoryPage(Model):
    next: str | None
    previous: str | None
    results: list[MemoryItem]


class MemoryEvent(Model):
    point_id: str
    kind: str
    at: datetime
    actor: str | None = None
    version: int | None = None
    changes: dict[str, Any]  # {field: {before, after}}
    other_point_id: str | None = None


class MemoryEventPage(Model):
    next: str | None
    previous: str | None
    results: list[MemoryEvent]


class StoredMemory(Model):
    point_id: str
    duplicate: str  # "", "exact" or "near": merged into that item
    indexed: bool
    item: MemoryItem


class StoredMemoryBatch(Model):
    items: list[StoredMemory]


class MemoryHit(Model):
    score: float  # ranks within one search; hybrid's can be negative
    relevance: float  # 0..1, comparable across queries
    item: MemoryItem


class MemorySearchResult(Model):
    results: list[MemoryHit]


class ContextTurn(Model):
    role: str
    content: str
    name: str | None = None
    at: datetime | None = None


class ContextMemory(Model):
    item: MemoryItem
    score: float
    relevance: float
    tokens: int


class ContextDropped(Model):
    turns: int
    memories: int


class MemoryContext(Model):
    context: str  # prompt-ready text within the token budget
    recent_turns: list[ContextTurn]
    memories: list[ContextMemory]
    tokens_used: int
    token_budget: int
    dropped: ContextDropped
    degraded: list[str]  # parts left out because their backend is down


# Sessions ------------------------------------------------------------------------------------


class WorkingMemoryState(Model):
    session_id: str
    agent_id: str
    task: str
    messages: list[Message]
    scratchpad: str
    facts: list[str]
    tool_state: dict[str, Any]
    step: int
    outcome: str
    metadata: dict[str, Any]
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    status: str | None = None


class Consolidation(Model):
    consolidation_id: int
    session_id: str
    agent_id: str
    version: int
    status: str | None = None
    reason: str
    task_id: str
    summary_item_id: str | None
    summary: str | None = None
    memory_item_ids: list[str]
    attempts: int | None = None
    created_at: datetime
    finished_at: datetime | None = None


# Agents --------------------------------------------------------------------------------------


class ErasureCounts(Model):
    sessions: int
    consolidations: int
    memory_items: int
    memory_events: int
    experiences: int
    dream_cycles: int
    dream_cycle_items: int


class AgentErasure(Model):
    agent_id: str
    erased_at: datetime
    actor: str
    counts: ErasureCounts
    erased_now: bool  # False: nothing was left, this is the last erasure's record


class ImportCounts(Model):
    memory_items: int
    memory_events: int
    experiences: int
    sessions: int
    dream_cycles: int


class AgentImport(Model):
    agent_id: str
    imported: ImportCounts
    skipped: ImportCounts  # already there
    reembedded: int  # items whose file's embedding model differs from the service's


# Experience replay ---------------------------------------------------------------------------


class Experience(Model):
    id: str
    agent_id: str
    session_id: str | None = None
    task: str
    tool_calls: list[ToolCall]
    test_result: TestResult | None
    passed: bool | None = None
    reward: float
    td_error: float | None = None
    priority: float
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    expires_at: datetime | None = None
    times_sampled: int = 0
    last_sampled_at: datetime | None = None
    retired_at: datetime | None = None  # drawn max_times_sampled times: no longer sampled


class ExperienceCreatedItem(Model):
    id: str
    created: bool


class ExperienceBatch(Model):
    created: int
    existing: int
    items: list[ExperienceCreatedItem]


class ExperiencePage(Model):
    next: str | None
    previous: str | None
    results: list[Experience]


class TdErrorResult(Model):
    updated: int
    unknown_ids: list[str]


class ReplayItem(Model):
    experience: Experience
    probability: float
    weight: float


class ReplayBatch(Model):
    strategy: str
    buffer_size: int
    alpha: float
    beta: float
    seed: int | None
    items: list[ReplayItem]


class ReplayLimiter(Model):
    inserts: int
    samples: int
    size: int
    ratio: float | None
    allowed: float
    inserts_needed: int


class ReplaySettings(Model):
    agent_id: str
    max_size: int
    remover: str
    max_times_sampled: int
    min_size: int
    samples_per_insert: float
    spi_tolerance: float
    alpha: float
    customized: bool  # False: the agent has the defaults
    limiter: ReplayLimiter


# Dream cycles --------------------------------------------------------------------------------


class DreamCycle(Model):
    id: int
    agent_id: str
    number: int
    status: str | None = None
    strategy: str
    alpha: float
    beta: float
    seed: int
    buffer_size: int
    item_count: int
    created_at: datetime
    claimed_by: str | None = None
    claimed_at: datetime | None = None
    lease_until: datetime | None = None
    claim_count: int | None = None
    completed_at: datetime | None = None


class DreamCycleItem(Model):
    position: int
    experience_id: str
    probability: float
    weight: float
    td_error_before: float | None = None
    td_error_after: float | None = None
    experience: Experience | None = None


class DreamCycleDetail(DreamCycle):
    items: list[DreamCycleItem]


class ClaimedDreamCycle(DreamCycleDetail):
    lease_token: str


class DreamCyclePage(Model):
    next: str | None
    previous: str | None
    results: list[DreamCycle]


class DreamCompletion(Model):
    cycle: DreamCycle
    updated: int
    unknown_ids: list[str]
