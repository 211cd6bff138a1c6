"""Extractive consolidation of a working-memory state: no LLM, embedding-based.

- The summary: the task, then the turns that best cover the session (greedy facility location
  over the turns' embeddings: each pick maximises how well every turn is represented by its most
  similar pick, so topics are covered rather than the centroid repeated), in spoken order, then
  the outcome. SESSION_SUMMARIZER may name a callable that writes the summary text instead.
- Key facts: what the agent wrote in `facts`, one semantic item each.
- Decisions: turns with a decision cue ("decided", "we will", "let's", ...), semantic items.
- Tool errors: every object in `tool_state` with a non-empty `error`, procedural items.
"""

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.utils.module_loading import import_string

# About this share of a session's turns is kept, within these bounds: the most representative
# SUMMARY_HEAD_TURNS in the summary, the others as salient turns of their own (an item per turn
# is found by a question about it far better than a long item that mentions it).
SUMMARY_TURN_RATIO = 0.15
SUMMARY_HEAD_TURNS = 2
SUMMARY_MIN_TURNS = 1
SUMMARY_MAX_TURNS = 12
SUMMARY_LINE_CHARS = 600
SUMMARY_MAX_CHARS = 8_000
# A turn shorter than this (in words) is covered but never picked: greetings, "ok", "thanks".
MIN_PICK_WORDS = 5
MAX_DECISIONS = 3
MAX_TOOL_ERRORS = 10
ITEM_CHARS = 2_000
DECISION_CUE = re.compile(
    r"\b(decided|decide to|decision|we will|we'll|let's|let us|going to|plan to|planning to|"
    r"chose|choose to|settled on|agreed|will use|switch(?:ed)? to|from now on)\b",
    re.IGNORECASE,
)


class Embedder(Protocol):
    def embed_documents(self, texts: list[str]) -> npt.NDArray[np.float32]: ...


@dataclass
class Extraction:
    summary: str
    key_facts: list[str]
    decisions: list[str]
    tool_errors: list[str]
    turn_count: int
    outcome: str
    summarizer: str  # "extractive" or the SESSION_SUMMARIZER path
    salient: list[str] = field(default_factory=list)
    picked: list[int] = field(default_factory=list)  # indexes of the kept turns, by rank


def message_line(message: dict[str, Any]) -> str:
    """`[at] speaker: text`, the speaker being the message's name, else its role."""
    speaker = message.get("name") or message.get("role") or "user"
    at = message.get("at") or ""
    text = " ".join(str(message.get("content", "")).split())
    return f"[{at}] {speaker}: {text}" if at else f"{speaker}: {text}"


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "…"


def representative_turns(
    vectors: npt.NDArray[np.float32], candidates: list[int], k: int
) -> list[int]:
    """Greedy facility location: k of `candidates` maximising sum_i max_{j in picks} sim(i, j)
    over every turn i (vectors are L2-normalised). Returns the picks, most representative first."""
    if k <= 0 or not candidates:
        return []
    similarity = np.clip(vectors @ vectors[candidates].T, 0.0, None)  # (turns, candidates)
    covered = np.zeros(len(vectors), dtype=np.float32)
    picks: list[int] = []
    available = np.ones(len(candidates), dtype=bool)
    for _ in range(min(k, len(candidates))):
        gains = np.maximum(similarity, covered[:, None]).sum(axis=0) - covered.sum()
        gains[~available] = -np.inf
        best = int(np.argmax(gains))
        picks.append(candidates[best])
        available[best] = False
        covered = np.maximum(covered, similarity[:, best])
    return picks


def summary_size(turns: int) -> int:
    return max(SUMMARY_MIN_TURNS, min(SUMMARY_MAX_TURNS, math.ceil(turns * SUMMARY_TURN_RATIO)))


def tool_errors(tool_state: Any, name: str = "") -> Iterator[str]:
    """`tool: error` for every object under tool_state with a non-empty string `error`."""
    if isinstance(tool_state, dict):
        label = str(tool_state.get("name") or tool_state.get("tool") or name)
        error = tool_state.get("error")
        if isinstance(error, str) and error.strip():
            yield f"Tool {label or 'call'} failed: {' '.join(error.split())}"
        for key, value in tool_state.items():
            if isinstance(value, dict | list):
                yield from tool_errors(value, label if key in {"calls", "errors"} else str(key))
    elif isinstance(tool_state, list):
        for value in tool_state:
            yield from tool_errors(value, name)


def _unique(texts: list[str]) -> list[str]:
    seen: set[str] = set()
    kept = []
    for text in texts:
        norm = " ".join(text.lower().split())
        if norm and norm not in seen:
            seen.add(norm)
            kept.append(text)
    return kept


def extract(state: dict[str, Any], *, embedder: Embedder) -> Extraction:
    messages = [m for m in state.get("messages", []) if str(m.get("content", "")).strip()]
    turns = [m for m in messages if m.get("role") != "system"]
    lines = [message_line(m) for m in turns]
    picked: list[int] = []
    if lines:
        vectors = embedder.embed_documents(lines)
        candidates = [
            i for i, m in enumerate(turns) if len(str(m["content"]).split()) >= MIN_PICK_WORDS
        ] or list(range(len(turns)))
        picked = representative_turns(vectors, candidates, summary_size(len(lines)))
    task = " ".join(str(state.get("task", "")).split())
    outcome = " ".join(str(state.get("outcome", "")).split())
    facts = _unique([_clip(" ".join(str(f).split()), ITEM_CHARS) for f in state.get("facts", [])])
    head = sorted(picked[:SUMMARY_HEAD_TURNS])
    salient = [_clip(lines[i], ITEM_CHARS) for i in sorted(picked[SUMMARY_HEAD_TURNS:])]
    decisions = _unique(
        [
            _clip(lines[i], ITEM_CHARS)
            for i in range(len(turns))
            if DECISION_CUE.search(lines[i]) and i not in picked
        ]
    )[-MAX_DECISIONS:]
    errors = _unique([_clip(e, ITEM_CHARS) for e in tool_errors(state.get("tool_state", {}))])
    errors = errors[:MAX_TOOL_ERRORS]

    summarizer_path = settings.SESSION_SUMMARIZER
    if summarizer_path:
        summarize: Callable[..., str] = import_string(summarizer_path)
        summary = summarize(state=state, lines=lines, picked=[lines[i] for i in sorted(picked)])
    else:
        parts = [f"Task: {task}"] if task else []
        parts += [_clip(lines[i], SUMMARY_LINE_CHARS) for i in head]
        if outcome:
            parts.append(f"Outcome: {outcome}")
        summary = "\n".join(parts)
    return Extraction(
        summary=_clip(summary.strip(), SUMMARY_MAX_CHARS),
        key_facts=facts,
        decisions=decisions,
        tool_errors=errors,
        salient=salient,
        turn_count=len(turns),
        outcome=outcome,
        summarizer=summarizer_path or "extractive",
        picked=picked,
    )


def memory_items(
    extraction: Extraction, *, agent_id: str, session_id: str, version: int
) -> list[dict[str, Any]]:
    """The memory items of one consolidation, the summary first (when there is one)."""
    common = {"agent_id": agent_id, "session_id": session_id, "source": "consolidation"}
    meta = {"session_version": version, "consolidation": extraction.summarizer}
    items: list[dict[str, Any]] = []
    if extraction.summary:
        items.append(
            {
                **common,
                "kind": "session_summary",
                "content": extraction.summary,
                "importance": 0.6,
                "tags": ["session_summary"],
                "metadata": {
                    **meta,
                    "turn_count": extraction.turn_count,
                    "outcome": extraction.outcome,
                    "key_facts": extraction.key_facts,
                },
            }
        )
    for kind, tag, importance, texts in (
        ("semantic", "fact", 0.7, extraction.key_facts),
        ("semantic", "decision", 0.6, extraction.decisions),
        ("semantic", "salient", 0.5, extraction.salient),
        ("procedural", "tool_error", 0.7, extraction.tool_errors),
    ):
        items += [
            {
                **common,
                "kind": kind,
                "content": text,
                "importance": importance,
                "tags": [tag],
                "metadata": meta,
            }
            for text in texts
        ]
    return items
