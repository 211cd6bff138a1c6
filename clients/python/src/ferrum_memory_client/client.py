"""The SDK: `Client` (sync) and `AsyncClient`, with the same methods, one per operation.

    from ferrum_memory_client import Client

    with Client() as ferrum:  # FERRUM_URL and FERRUM_API_KEY, or Client(api_key, base_url)
        ferrum.memory_store(agent_id="a1", content="The deploy script lives in ops/deploy.sh")
        hits = ferrum.memory_search(agent_id="a1", query="where is the deploy script?").results

A new operation of the service is one declaration in `Operations`: the builder's keyword
arguments become the method's signature on both clients.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import httpx

from ._base import AsyncTransport, Call, SyncTransport, nothing, operation, parsed, present
from .errors import ConflictError
from .models import (
    AgentErasure,
    AgentImport,
    ClaimedDreamCycle,
    Consolidation,
    DreamCompletion,
    DreamCycleDetail,
    DreamCyclePage,
    Experience,
    ExperienceBatch,
    ExperiencePage,
    Health,
    MemoryContext,
    MemoryEventPage,
    MemoryItem,
    MemoryKind,
    MemoryPage,
    MemorySearchResult,
    MemorySource,
    Message,
    ReplayBatch,
    ReplaySettings,
    ReplayStrategy,
    SearchMode,
    Sensitivity,
    StoredMemory,
    StoredMemoryBatch,
    TdErrorResult,
    TestResult,
    ToolCall,
    WorkingMemoryState,
)

JSON = dict[str, Any]


def new_experience_id() -> str:
    """An experience id made by the client, so that a retried POST stores the experience once."""
    return uuid.uuid4().hex


def cursor_of(page_url: str | None) -> str | None:
    """The `cursor` of a page's `next` or `previous` link, for the list methods' `cursor=`."""
    if not page_url:
        return None
    return parse_qs(urlsplit(page_url).query).get("cursor", [None])[0]


def _with_id(item: Mapping[str, Any]) -> JSON:
    experience = present(**item)
    experience.setdefault("id", new_experience_id())
    return experience


def _claimed(response: httpx.Response) -> ClaimedDreamCycle | None:
    if response.status_code == 204:
        return None
    return ClaimedDreamCycle.model_validate_json(response.content)


def _td_errors(td_errors: Mapping[str, float]) -> list[JSON]:
    return [{"experience_id": k, "td_error": float(v)} for k, v in td_errors.items()]


class Operations:
    """Every operation of /openapi.json. Arguments left as None take the service's default."""

    # Service ---------------------------------------------------------------------------------

    @operation("GET", "/health", idempotent=True)
    def health() -> Call[Health]:
        """Each backend's status. A 503 (a backend down) raises ServiceUnavailableError after the
        retries; its `body` holds the same report."""
        return Call(parsed(Health))

    @operation("GET", "/stats", idempotent=True)
    def stats() -> Call[JSON]:
        """Statistics, one section per capability."""
        return Call(parsed(JSON))

    @operation("GET", "/metrics", idempotent=True)
    def metrics() -> Call[str]:
        """The Prometheus exposition text."""
        return Call(lambda response: response.text)

    # Long-term memory ------------------------------------------------------------------------

    # Storing the same content again merges it into the item it duplicates, so a retry stores once.
    @operation("POST", "/memory/store", idempotent=True)
    def memory_store(
        *,
        agent_id: str,
        content: str,
        kind: MemoryKind | None = None,
        source: MemorySource | None = None,
        importance: float | None = None,
        sensitivity: Sensitivity | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        ttl_seconds: int | None = None,
    ) -> Call[StoredMemory]:
        """Store one memory item; exact and near duplicates are merged (`duplicate` says so)."""
        body = present(
            agent_id=agent_id,
            content=content,
            kind=kind,
            source=source,
            importance=importance,
            sensitivity=sensitivity,
            tags=tags,
            metadata=metadata,
            session_id=session_id,
            ttl_seconds=ttl_seconds,
        )
        return Call(parsed(StoredMemory), body=body)

    @operation("POST", "/memory/store", idempotent=True)
    def memory_store_many(*, items: Sequence[Mapping[str, Any]]) -> Call[StoredMemoryBatch]:
        """Store up to 256 items (the fields of `memory_store`), embedded in one batch."""
        return Call(parsed(StoredMemoryBatch), body=[present(**item) for item in items])

    @operation("POST", "/memory/search", idempotent=True)
    def memory_search(
        *,
        agent_id: str,
        query: str,
        limit: int | None = None,
        mode: SearchMode | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        tags: Sequence[str] | None = None,
        session_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        min_importance: float | None = None,
        max_sensitivity: Sensitivity | None = None,
        min_relevance: float | None = None,
        session_diversity: float | None = None,
        rerank: bool | None = None,
    ) -> Call[MemorySearchResult]:
        """Hybrid (default), dense or sparse search of an agent's memory, best first. A hybrid
        search's `session_diversity` of about 1 spreads the hits over sessions."""
        body = present(
            agent_id=agent_id,
            query=query,
            limit=limit,
            mode=mode,
            kinds=kinds,
            tags=tags,
            session_id=session_id,
            created_after=created_after,
            created_before=created_before,
            min_importance=min_importance,
            max_sensitivity=max_sensitivity,
            min_relevance=min_relevance,
            session_diversity=session_diversity,
        )
        return Call(parsed(MemorySearchResult), query={"rerank": rerank}, body=body)

    @operation("POST", "/memory/context", idempotent=True)
    def memory_context(
        *,
        agent_id: str,
        query: str,
        token_budget: int,
        session_id: str | None = None,
        recent_share: float | None = None,
        memory_share: float | None = None,
        limit: int | None = None,
        min_relevance: float | None = None,
        mode: SearchMode | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        tags: Sequence[str] | None = None,
        max_sensitivity: Sensitivity | None = None,
        recency_half_life: float | None = None,
        importance_weight: float | None = None,
    ) -> Call[MemoryContext]:
        """The prompt-ready context for the next LLM call: the session's recent turns and the
        relevant memories, within `token_budget` tokens (`context` is the text)."""
        body = present(
            agent_id=agent_id,
            query=query,
            token_budget=token_budget,
            session_id=session_id,
            recent_share=recent_share,
            memory_share=memory_share,
            limit=limit,
            min_relevance=min_relevance,
            mode=mode,
            kinds=kinds,
            tags=tags,
            max_sensitivity=max_sensitivity,
            recency_half_life=recency_half_life,
            importance_weight=importance_weight,
        )
        return Call(parsed(MemoryContext), body=body)

    @operation("GET", "/memory/{point_id}", idempotent=True)
    def memory_get(*, point_id: str) -> Call[MemoryItem]:
        return Call(parsed(MemoryItem), path={"point_id": point_id})

    @operation("GET", "/memory/", idempotent=True)
    def memory_list(
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        kind: MemoryKind | None = None,
        source: MemorySource | None = None,
        sensitivity: Sensitivity | None = None,
        tags: Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        cursor: str | None = None,
    ) -> Call[MemoryPage]:
        """An agent's items, newest first; the next page is `cursor=cursor_of(page.next)`."""
        query = present(
            agent_id=agent_id,
            session_id=session_id,
            kind=kind,
            source=source,
            sensitivity=sensitivity,
            tags=",".join(tags) if tags else None,  # items with every one of them
            created_after=created_after,
            created_before=created_before,
            cursor=cursor,
        )
        return Call(parsed(MemoryPage), query=query)

    # Optimistic concurrency: a retry of an update that went through would answer 409.
    @operation("PATCH", "/memory/{point_id}", idempotent=False)
    def memory_update(
        *,
        point_id: str,
        version: int,
        content: str | None = None,
        importance: float | None = None,
        sensitivity: Sensitivity | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        ttl_seconds: int | None = None,
    ) -> Call[StoredMemory]:
        """Change an item (re-embedded when its content changes); `version` is the one read
        last (ConflictError with `body["current_version"]` if stale)."""
        body = present(
            version=version,
            content=content,
            importance=importance,
            sensitivity=sensitivity,
            tags=tags,
            metadata=metadata,
            ttl_seconds=ttl_seconds,
        )
        return Call(parsed(StoredMemory), path={"point_id": point_id}, body=body)

    @operation("GET", "/memory/{point_id}/history", idempotent=True)
    def memory_history(*, point_id: str, cursor: str | None = None) -> Call[MemoryEventPage]:
        """Every change of an item, oldest first, with each field's value before and after."""
        return Call(parsed(MemoryEventPage), path={"point_id": point_id}, query={"cursor": cursor})

    # A retry of a delete that went through would answer 404: only retried when not sent.
    @operation("DELETE", "/memory/{point_id}", idempotent=False)
    def memory_delete(*, point_id: str) -> Call[None]:
        return Call(nothing, path={"point_id": point_id})

    @operation("POST", "/memory/compress", idempotent=True)
    def memory_compress(*, session_id: str) -> Call[Consolidation]:
        """Consolidate a session's working memory into memory items now, without closing it."""
        return Call(parsed(Consolidation), query={"session_id": session_id})

    # Sessions (working memory) ---------------------------------------------------------------

    @operation("POST", "/session/start", idempotent=False)
    def session_start(
        *,
        agent_id: str,
        task: str | None = None,
        scratchpad: str | None = None,
        facts: Sequence[str] | None = None,
        tool_state: Mapping[str, Any] | None = None,
        step: int | None = None,
        outcome: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        messages: Sequence[Message | Mapping[str, Any]] | None = None,
        ttl_seconds: int | None = None,
    ) -> Call[WorkingMemoryState]:
        body = present(
            agent_id=agent_id,
            task=task,
            scratchpad=scratchpad,
            facts=facts,
            tool_state=tool_state,
            step=step,
            outcome=outcome,
            metadata=metadata,
            messages=messages,
            ttl_seconds=ttl_seconds,
        )
        return Call(parsed(WorkingMemoryState), body=body)

    @operation("GET", "/session/{session_id}", idempotent=True)
    def session_get(*, session_id: str) -> Call[WorkingMemoryState]:
        return Call(parsed(WorkingMemoryState), path={"session_id": session_id})

    # Optimistic concurrency: a retry of an update that went through would answer 409.
    @operation("PUT", "/session/{session_id}", idempotent=False)
    def session_update(
        *,
        session_id: str,
        version: int,
        append_messages: Sequence[Message | Mapping[str, Any]] | None = None,
        task: str | None = None,
        scratchpad: str | None = None,
        facts: Sequence[str] | None = None,
        tool_state: Mapping[str, Any] | None = None,
        step: int | None = None,
        outcome: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Call[WorkingMemoryState]:
        """Set fields and append messages; `version` is the one read (ConflictError if stale)."""
        body = present(
            version=version,
            append_messages=append_messages,
            task=task,
            scratchpad=scratchpad,
            facts=facts,
            tool_state=tool_state,
            step=step,
            outcome=outcome,
            metadata=metadata,
        )
        return Call(parsed(WorkingMemoryState), path={"session_id": session_id}, body=body)

    @operation("POST", "/session/close", idempotent=True)
    def session_close(*, session_id: str) -> Call[Consolidation]:
        """Close a session; the worker consolidates it. Closing again answers the same one."""
        return Call(parsed(Consolidation), body={"session_id": session_id})

    # Agents ----------------------------------------------------------------------------------

    # Erasing again answers the last erasure's record (erased_now false).
    @operation("DELETE", "/agents/{agent_id}", idempotent=True)
    def agent_erase(*, agent_id: str) -> Call[AgentErasure]:
        """Erase everything of one agent (memories and their history, sessions, experiences,
        dream cycles), with the counts of what was deleted."""
        return Call(parsed(AgentErasure), path={"agent_id": agent_id})

    @operation("GET", "/agents/{agent_id}/export", idempotent=True)
    def agent_export(*, agent_id: str) -> Call[bytes]:
        """Everything of one agent as JSON Lines (memories with embeddings and history,
        sessions, experiences, dream cycles), for `agent_import` here or elsewhere."""
        return Call(lambda response: response.content, path={"agent_id": agent_id})

    @operation("POST", "/agents/{agent_id}/import", idempotent=False)
    def agent_import(*, agent_id: str, data: bytes) -> Call[AgentImport]:
        """Bring an `agent_export` file back, all or nothing (BadRequestError names a bad
        line); items already there are skipped."""
        return Call(
            parsed(AgentImport),
            path={"agent_id": agent_id},
            content=data,
            content_type="application/x-ndjson",
        )

    # Experience replay -----------------------------------------------------------------------

    @operation("POST", "/experience/", idempotent=True)
    def experience_record(
        *,
        agent_id: str,
        task: str,
        reward: float,
        tool_calls: Sequence[ToolCall | Mapping[str, Any]] | None = None,
        test_result: TestResult | Mapping[str, Any] | None = None,
        id: str | None = None,
        session_id: str | None = None,
        td_error: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        ttl_seconds: int | None = None,
    ) -> Call[Experience]:
        """Store one experience. Its id is made here when not given, so a retry stores it once."""
        body = _with_id(
            dict(
                id=id,
                agent_id=agent_id,
                task=task,
                reward=reward,
                tool_calls=tool_calls,
                test_result=test_result,
                session_id=session_id,
                td_error=td_error,
                metadata=metadata,
                ttl_seconds=ttl_seconds,
            )
        )
        return Call(parsed(Experience), body=body)

    @operation("POST", "/experience/", idempotent=True)
    def experience_record_many(*, items: Sequence[Mapping[str, Any]]) -> Call[ExperienceBatch]:
        """Store up to 1,000 experiences (the fields of `experience_record`), all or none."""
        return Call(parsed(ExperienceBatch), body=[_with_id(item) for item in items])

    @operation("GET", "/experience/", idempotent=True)
    def experience_list(
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        passed: bool | None = None,
        sampled: bool | None = None,
        cursor: str | None = None,
    ) -> Call[ExperiencePage]:
        """Newest first; the next page is `experience_list(cursor=cursor_of(page.next))`."""
        query = present(
            agent_id=agent_id, session_id=session_id, passed=passed, sampled=sampled, cursor=cursor
        )
        return Call(parsed(ExperiencePage), query=query)

    @operation("GET", "/experience/{experience_id}", idempotent=True)
    def experience_get(*, experience_id: str) -> Call[Experience]:
        return Call(parsed(Experience), path={"experience_id": experience_id})

    @operation("DELETE", "/experience/{experience_id}", idempotent=False)
    def experience_delete(*, experience_id: str) -> Call[None]:
        return Call(nothing, path={"experience_id": experience_id})

    @operation("GET", "/experience/stats", idempotent=True)
    def experience_stats() -> Call[JSON]:
        return Call(parsed(JSON))

    # Setting a TD error twice leaves it as set once.
    @operation("PUT", "/experience/td-error", idempotent=True)
    def experience_td_errors_update(*, td_errors: Mapping[str, float]) -> Call[TdErrorResult]:
        """Set TD errors, {experience_id: td_error}, up to 10,000; unknown ids are reported."""
        return Call(parsed(TdErrorResult), body={"updates": _td_errors(td_errors)})

    @operation("GET", "/experience/settings", idempotent=True)
    def experience_settings_get(*, agent_id: str) -> Call[ReplaySettings]:
        """An agent's replay settings (capacity, remover, sampling cap, rate limiter)."""
        return Call(parsed(ReplaySettings), query={"agent_id": agent_id})

    # Setting the same values twice leaves them as set once.
    @operation("PUT", "/experience/settings", idempotent=True)
    def experience_settings_put(
        *,
        agent_id: str,
        max_size: int | None = None,
        remover: Literal["fifo", "lowest_priority"] | None = None,
        max_times_sampled: int | None = None,
        min_size: int | None = None,
        samples_per_insert: float | None = None,
        spi_tolerance: float | None = None,
        alpha: float | None = None,
    ) -> Call[ReplaySettings]:
        """Set an agent's replay settings (a key not limited to agents only)."""
        body = present(
            agent_id=agent_id,
            max_size=max_size,
            remover=remover,
            max_times_sampled=max_times_sampled,
            min_size=min_size,
            samples_per_insert=samples_per_insert,
            spi_tolerance=spi_tolerance,
            alpha=alpha,
        )
        return Call(parsed(ReplaySettings), body=body)

    @operation("GET", "/experience/replay", idempotent=True)
    def replay_sample(
        *,
        strategy: ReplayStrategy | None = None,
        batch_size: int | None = None,
        agent_id: str | None = None,
        alpha: float | None = None,
        beta: float | None = None,
        half_life: float | None = None,
        seed: int | None = None,
        min_size: int | None = None,
        stratified: bool | None = None,
    ) -> Call[ReplayBatch]:
        """A replay batch, each item with its probability and importance-sampling weight."""
        query = dict(
            strategy=strategy,
            batch_size=batch_size,
            agent_id=agent_id,
            alpha=alpha,
            beta=beta,
            half_life=half_life,
            seed=seed,
            min_size=min_size,
            stratified=stratified,
        )
        return Call(parsed(ReplayBatch), query=query)

    # Dream cycles ----------------------------------------------------------------------------

    @operation("GET", "/dream/cycles/", idempotent=True)
    def dream_cycles_list(
        *, agent_id: str | None = None, status: str | None = None, cursor: str | None = None
    ) -> Call[DreamCyclePage]:
        query = present(agent_id=agent_id, status=status, cursor=cursor)
        return Call(parsed(DreamCyclePage), query=query)

    @operation("GET", "/dream/cycles/{cycle_id}", idempotent=True)
    def dream_cycle_get(*, cycle_id: int) -> Call[DreamCycleDetail]:
        return Call(parsed(DreamCycleDetail), path={"cycle_id": cycle_id})

    # A retried claim could lease a second cycle: only retried when not sent.
    @operation("POST", "/dream/cycles/claim", idempotent=False)
    def dream_cycle_claim(
        *, agent_id: str, learner: str | None = None, lease_seconds: int | None = None
    ) -> Call[ClaimedDreamCycle | None]:
        """Lease the agent's oldest unclaimed cycle, with its draws; None when there is none."""
        body = present(agent_id=agent_id, learner=learner, lease_seconds=lease_seconds)
        return Call(_claimed, body=body)

    # A report that went through completes the cycle, and a second one answers 409.
    @operation("POST", "/dream/cycles/{cycle_id}/td-errors", idempotent=False)
    def dream_cycle_report(
        *, cycle_id: int, lease_token: str, td_errors: Mapping[str, float]
    ) -> Call[DreamCompletion]:
        """Report a TD error for each experience of a claimed cycle; ConflictError when the
        lease was lost (the cycle's new holder reports instead)."""
        body = {"lease_token": lease_token, "td_errors": _td_errors(td_errors)}
        return Call(parsed(DreamCompletion), path={"cycle_id": cycle_id}, body=body)


APPEND_ATTEMPTS = 5  # reads and writes of one append, when other writers keep winning


class Client(SyncTransport, Operations):
    """The sync client: `Client(api_key=None, base_url=None, *, timeout, retry, http_client)`.

    The key and URL default to FERRUM_API_KEY and FERRUM_URL (else http://127.0.0.1:8000)."""

    def session_append(
        self, *, session_id: str, messages: Sequence[Message | Mapping[str, Any]]
    ) -> WorkingMemoryState:
        """Append messages to a session whatever its version: read it, update it with the
        version read, and read again when another writer got in between (409)."""
        attempt = 1
        while True:
            version = self.session_get(session_id=session_id).version
            try:
                return self.session_update(
                    session_id=session_id, version=version, append_messages=messages
                )
            except ConflictError:
                if attempt == APPEND_ATTEMPTS:
                    raise
                attempt += 1


class AsyncClient(AsyncTransport, Operations):
    """The async client, the same methods as `Client`, each awaited."""

    async def session_append(
        self, *, session_id: str, messages: Sequence[Message | Mapping[str, Any]]
    ) -> WorkingMemoryState:
        """Append messages to a session whatever its version: read it, update it with the
        version read, and read again when another writer got in between (409)."""
        attempt = 1
        while True:
            version = (await self.session_get(session_id=session_id)).version
            try:
                return await self.session_update(
                    session_id=session_id, version=version, append_messages=messages
                )
            except ConflictError:
                if attempt == APPEND_ATTEMPTS:
                    raise
                attempt += 1
