"""The context for an agent's next LLM call: its session's recent turns and the memories relevant
to a query, packed into one prompt-ready text that fits a token budget.

The budget is split in two shares. Recent turns go in newest first until theirs is used, then
memories by rank until theirs is; what one part leaves unused goes to the other. Nothing is cut
mid-text: a turn or a memory is in whole or left out. The text is counted as it is sent (token
counts of pieces do not always add up across their joins), so `tokens_used` is exact.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from ferrum_memory.core.exceptions import Conflict, Unavailable
from sessions.selectors import session_state_get

from .models import MemoryItem
from .selectors import MemoryHit, memory_search
from .tokens import count_tokens

logger = logging.getLogger(__name__)

RECENT_HEADER = "## Recent turns"
MEMORY_HEADER = "## Relevant memories"
DEFAULT_RECENT_SHARE = 0.5
MAX_TOKEN_BUDGET = 200_000


@dataclass(frozen=True)
class ContextMemory:
    hit: MemoryHit
    rank: float  # what the memories are ordered by: relevance, or weighted (see memory_context)
    tokens: int


@dataclass
class Context:
    context: str
    recent_turns: list[dict[str, Any]]
    memories: list[ContextMemory]
    tokens_used: int
    token_budget: int
    dropped: dict[str, int]
    degraded: list[str] = field(default_factory=list)


def turn_line(message: dict[str, Any]) -> str:
    speaker = message.get("name") or message["role"]
    when = f"[{message['at']}] " if message.get("at") else ""
    return f"{when}{speaker}: {message['content']}"


def memory_line(item: MemoryItem) -> str:
    return f"- [{item.created_at.date().isoformat()}, {item.kind}] {item.content}"


def render(turns: Sequence[dict[str, Any]], memories: Sequence[ContextMemory]) -> str:
    """The context text: a section per part that has anything, turns oldest first."""
    sections = []
    if turns:
        sections.append("\n".join([RECENT_HEADER, *(turn_line(m) for m in turns)]))
    if memories:
        sections.append("\n".join([MEMORY_HEADER, *(memory_line(m.hit.item) for m in memories)]))
    return "\n\n".join(sections)


def _take(costs: Sequence[int], budget: int, header: int) -> int:
    """How many of `costs`, in order, fit in `budget` together with a section header."""
    used, taken = header, 0
    for cost in costs:
        if used + cost > budget:
            break
        used, taken = used + cost, taken + 1
    return taken


def _cost(taken: int, costs: Sequence[int], header: int) -> int:
    return header + sum(costs[:taken]) if taken else 0


def _repeats_a_turn(item: MemoryItem, session_id: str, turns: Sequence[dict[str, Any]]) -> bool:
    """A memory written from one of these turns (a consolidation keeps a turn whole or some of
    its sentences) would say the same thing twice."""
    if not session_id or item.session_id != session_id:
        return False
    said = " ".join(item.content.lower().split())
    return any(said in " ".join(turn["content"].lower().split()) for turn in turns)


def memory_context(
    *,
    agent_id: str,
    query: str,
    token_budget: int,
    session_id: str = "",
    recent_share: float = DEFAULT_RECENT_SHARE,
    limit: int = 10,
    min_relevance: float | None = None,
    recency_half_life: float = 0.0,
    importance_weight: float = 0.0,
    agent_ids: Sequence[str] | None = None,
    now: datetime | None = None,
    **search: Any,
) -> Context:
    """The context for `query`. `search` holds memory_search's filters (kinds, tags,
    max_sensitivity, mode). Memories rank by relevance; with `recency_half_life` (seconds) it is
    weighed by 0.5^(age / half-life), and `importance_weight` w mixes in importance:
    (1 - w) * relevance * decay + w * importance. With the working memory or the vector index
    down, the other part still answers and `degraded` names what is missing."""
    now = now or timezone.now()
    degraded: list[str] = []
    messages: list[dict[str, Any]] = []
    if session_id:
        try:
            session, state = session_state_get(session_id=session_id, agent_ids=agent_ids)
        except Unavailable as exc:
            logger.warning("context without recent turns, working memory down: %s", exc)
            degraded.append("working_memory")
        else:
            if session.agent_id != agent_id:
                # 409, as an import naming another agent's id: the request is well formed.
                raise Conflict(f"Session {session_id} belongs to another agent, not {agent_id!r}.")
            messages = list(state.get("messages", []))
    hits: list[MemoryHit] = []
    try:
        hits = memory_search(
            query=query,
            agent_id=agent_id,
            limit=limit,
            min_relevance=settings.CONTEXT_MIN_RELEVANCE
            if min_relevance is None
            else min_relevance,
            **search,
        )
    except Unavailable as exc:
        logger.warning("context without memories, vector index down: %s", exc)
        degraded.append("vector_index")

    ranked = sorted(
        (_ranked(hit, now, recency_half_life, importance_weight) for hit in hits),
        key=lambda memory: memory.rank,
        reverse=True,
    )
    context = pack_context(
        messages=messages,
        ranked=ranked,
        token_budget=token_budget,
        recent_share=recent_share,
        session_id=session_id,
    )
    context.degraded = degraded
    return context


def pack_context(
    *,
    messages: Sequence[dict[str, Any]],
    ranked: Sequence[ContextMemory],
    token_budget: int,
    recent_share: float,
    session_id: str = "",
) -> Context:
    """Fit the session's `messages` (oldest first) and the `ranked` memories into the budget."""
    newest_first = list(messages)[::-1]
    turn_costs = [count_tokens(turn_line(m) + "\n") for m in newest_first]
    turn_header = count_tokens(RECENT_HEADER + "\n")
    memory_header = count_tokens("\n\n" + MEMORY_HEADER + "\n")

    # The turns take their share first; the memories the rest; then the turns what is left.
    turns = _take(turn_costs, int(token_budget * recent_share), turn_header)
    kept = newest_first[:turns]
    candidates = [m for m in ranked if not _repeats_a_turn(m.hit.item, session_id, kept)]
    memory_costs = [m.tokens for m in candidates]
    memories = _take(
        memory_costs, token_budget - _cost(turns, turn_costs, turn_header), memory_header
    )
    turns = _take(
        turn_costs, token_budget - _cost(memories, memory_costs, memory_header), turn_header
    )
    chosen_turns = newest_first[:turns][::-1]
    # Older turns may have come in with the rest of the budget: no memory repeats them either.
    chosen = [
        m
        for m in candidates[:memories]
        if not _repeats_a_turn(m.hit.item, session_id, chosen_turns)
    ]
    text = render(chosen_turns, chosen)
    used = count_tokens(text)
    # Tokens can merge across a join: trim the last memory, then the oldest turn, until it fits.
    while used > token_budget:
        if chosen:
            chosen = chosen[:-1]
        else:
            chosen_turns = chosen_turns[1:]
        text = render(chosen_turns, chosen)
        used = count_tokens(text)
    return Context(
        context=text,
        recent_turns=chosen_turns,
        memories=chosen,
        tokens_used=used,
        token_budget=token_budget,
        dropped={
            "turns": len(messages) - len(chosen_turns),
            "memories": len(ranked) - len(chosen),
        },
    )


def _ranked(
    hit: MemoryHit, now: datetime, half_life: float, importance_weight: float
) -> ContextMemory:
    decay = 1.0
    if half_life > 0:
        age = max((now - hit.item.created_at).total_seconds(), 0.0)
        decay = 0.5 ** (age / half_life)
    rank = (1 - importance_weight) * hit.relevance * decay + importance_weight * hit.item.importance
    return ContextMemory(hit, rank, count_tokens(memory_line(hit.item) + "\n"))
