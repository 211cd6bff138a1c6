"""Extractive consolidation of a working-memory state: no LLM, embedding-based.

The turns are split into sentences and a budget of words (SESSION_CONSOLIDATION_SHARE of the
session's words) is filled greedily, as in budgeted submodular maximisation (Lin and Bilmes
2010): each step keeps the sentence with the best gain per word it adds to the stored items.
The gain mixes
- coverage: how well every sentence of the session is represented by its most similar kept
  sentence (facility location over the embeddings), so the session's topics are covered rather
  than its centroid repeated;
- specificity: the search terms (memory search's BM25 tokens) the sentence adds, each weighted
  by its rarity among the session's sentences, so names, places, numbers and rare words are
  kept and filler ("haha, so true!") is not.
A turn's first kept sentence also pays for the turn's "[at] speaker:" prefix, since each kept
turn is stored as its own item (a question about one turn finds an item about that turn far
better than a long item that mentions it) and the date and speaker are what queries ask about.

- The summary: the task, the SUMMARY_HEAD_TURNS turns kept first (most valuable) in spoken
  order, the key terms (names first, then the rarest words) whose search terms no kept sentence
  has, in what is left of the budget (at least KEY_TERMS_SHARE), then the outcome, so search
  finds the session by what the kept turns leave out. SESSION_SUMMARIZER may name a callable
  that writes the summary instead.
- Decisions: the other kept turns with a decision cue ("decided", "we will", "let's", ...).
- Salient: the rest of the kept turns.
- Key facts: what the agent wrote in `facts`, one semantic item each.
- Tool errors: every object in `tool_state` with a non-empty `error`, procedural items.
"""

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.utils.module_loading import import_string

# A session shorter than this (in words) has this much kept: a few turns are worth keeping whole.
MIN_BUDGET_WORDS = 60
# This share of the budget goes to the summary's list of key terms the kept sentences miss.
KEY_TERMS_SHARE = 0.35
# How the gain weighs coverage (embeddings) against specificity (search terms), each 0..1.
COVERAGE_WEIGHT = 0.1
# Coverage is measured on at most this many sentences of a session (a step costs
# O(candidates * this)).
MAX_COVERED = 1_000
# At most this many sentences compete for the budget (see budgeted_picks).
MAX_CANDIDATES = 1_000
# A sentence shorter than this (in words) is covered but never kept: "ok", "thanks!", "wow".
MIN_PICK_WORDS = 3
SUMMARY_HEAD_TURNS = 2
SUMMARY_MAX_CHARS = 8_000
MAX_TOOL_ERRORS = 10
ITEM_CHARS = 2_000
DECISION_CUE = re.compile(
    r"\b(decided|decide to|decision|we will|we'll|let's|let us|going to|plan to|planning to|"
    r"chose|choose to|settled on|agreed|will use|switch(?:ed)? to|from now on)\b",
    re.IGNORECASE,
)
WORD = re.compile(r"\w[\w'-]*")
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")


class Embedder(Protocol):
    def embed_documents(self, texts: list[str]) -> npt.NDArray[np.float32]: ...

    def sparse_document(self, text: str) -> Any: ...  # .indices: the text's search terms


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


@dataclass(frozen=True)
class Sentence:
    turn: int
    text: str
    words: int
    terms: frozenset[int]


def message_prefix(message: dict[str, Any]) -> str:
    """`[at] speaker:`, the speaker being the message's name, else its role."""
    speaker = message.get("name") or message.get("role") or "user"
    at = message.get("at") or ""
    return f"[{at}] {speaker}:" if at else f"{speaker}:"


def message_line(message: dict[str, Any]) -> str:
    return f"{message_prefix(message)} {' '.join(str(message.get('content', '')).split())}"


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "…"


def split_sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(" ".join(text.split())) if s]


def word_budget(words: int) -> int:
    return max(MIN_BUDGET_WORDS, math.floor(words * settings.SESSION_CONSOLIDATION_SHARE))


def budgeted_picks(
    vectors: npt.NDArray[np.float32],
    sentences: Sequence[Sentence],
    prefix_words: Sequence[int],
    budget: int,
) -> list[int]:
    """Sentence indexes to keep, in the order kept: greedily the best gain per added word while
    a candidate fits the budget. `vectors` are L2-normalised; `prefix_words[t]` is what turn
    t's first kept sentence pays on top of its own words."""
    n = len(sentences)
    covered_rows = np.linspace(0, n - 1, min(n, MAX_COVERED)).round().astype(int)
    rarity = term_rarity(sentences)
    all_rarity = sum(rarity.values()) or 1.0
    terms: set[int] = set()
    turns: set[int] = set()
    picks: list[int] = []
    spent = 0

    def cost(i: int) -> int:
        prefix = 0 if sentences[i].turn in turns else prefix_words[sentences[i].turn]
        return sentences[i].words + prefix

    def specificity(i: int) -> float:
        return sum(rarity[t] for t in sentences[i].terms - terms) / all_rarity

    candidates = [i for i, s in enumerate(sentences) if s.words >= MIN_PICK_WORDS]
    # (covered rows, candidates), cosine similarity floored at 0.
    similarity = np.clip(vectors[covered_rows] @ vectors[candidates].T, 0.0, None)
    if len(candidates) > MAX_CANDIDATES:
        # Every step rescores every candidate; on a very long session keep those worth most on
        # their own, so that a consolidation stays well inside the task's time limit.
        alone = COVERAGE_WEIGHT * similarity.mean(axis=0) + (1 - COVERAGE_WEIGHT) * np.array(
            [specificity(i) for i in candidates]
        )
        alone /= np.array([cost(i) for i in candidates])
        keep = np.sort(np.argsort(-alone, kind="stable")[:MAX_CANDIDATES])
        candidates = [candidates[k] for k in keep]
        similarity = similarity[:, keep]
    column = {i: k for k, i in enumerate(candidates)}
    covered = np.zeros(len(covered_rows), dtype=np.float32)
    while candidates:
        gains = np.maximum(similarity, covered[:, None]).sum(axis=0) - covered.sum()
        coverage = gains / len(covered)  # 0..1, as specificity
        best, best_value = -1, 0.0
        for i in candidates:
            if spent + cost(i) <= budget:
                gain = COVERAGE_WEIGHT * coverage[column[i]] + (1 - COVERAGE_WEIGHT) * specificity(
                    i
                )
                if gain / cost(i) > best_value:
                    best, best_value = i, gain / cost(i)
        if best < 0:
            break
        spent += cost(best)
        picks.append(best)
        candidates.remove(best)
        turns.add(sentences[best].turn)
        terms.update(sentences[best].terms)
        covered = np.maximum(covered, similarity[:, column[best]])
    return picks


def term_rarity(sentences: Sequence[Sentence]) -> dict[int, float]:
    """Each search term's inverse document frequency over the session's sentences."""
    frequency = Counter(t for s in sentences for t in s.terms)
    return {t: math.log(1 + len(sentences) / df) for t, df in frequency.items()}


def key_terms(
    sentences: Sequence[Sentence], picks: Sequence[int], embedder: Embedder, budget: int
) -> list[str]:
    """Up to `budget` words of the session whose search terms the kept sentences miss: names
    first (capitalised inside a sentence), then the rarest in the session. The summary lists
    them so that search finds the session by what the kept sentences left out."""
    rarity = term_rarity(sentences)
    covered = {t for i in picks for t in sentences[i].terms}
    rank: dict[str, tuple[bool, float, int]] = {}  # word -> sort key
    for sentence in sentences:
        for position, match in enumerate(WORD.finditer(sentence.text)):
            word = match[0]
            terms = set(embedder.sparse_document(word).indices)
            if terms and not terms & covered:
                covered |= terms  # one word per term
                name = position > 0 and word[0].isupper()
                rank[word] = (not name, -max(rarity[t] for t in terms), -len(word))
    return sorted(rank, key=rank.__getitem__)[: max(budget, 0)]


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
    sentences = [
        Sentence(turn, text, len(text.split()), frozenset(embedder.sparse_document(text).indices))
        for turn, message in enumerate(turns)
        for text in split_sentences(str(message["content"]))
    ]
    kept: dict[int, list[int]] = {}  # turn -> its kept sentences, turns in the order kept
    terms: list[str] = []
    if sentences:
        words = sum(len(line.split()) for line in lines)
        budget = word_budget(words)
        # Key terms get their share of the budget unless the whole session fits in it.
        sentences_budget = budget if words <= budget else math.floor(budget * (1 - KEY_TERMS_SHARE))
        prefix_words = [len(message_prefix(m).split()) for m in turns]
        picks = budgeted_picks(
            embedder.embed_documents([s.text for s in sentences]),
            sentences,
            prefix_words,
            sentences_budget,
        )
        for i in picks:
            kept.setdefault(sentences[i].turn, []).append(i)
        spent = sum(sentences[i].words for i in picks) + sum(prefix_words[t] for t in kept)
        terms = key_terms(sentences, picks, embedder, budget - spent - 1)  # 1: "Topics:"

    def kept_line(turn: int) -> str:
        text = " ".join(sentences[i].text for i in sorted(kept[turn]))
        return _clip(f"{message_prefix(turns[turn])} {text}", ITEM_CHARS)

    picked = list(kept)
    head = sorted(picked[:SUMMARY_HEAD_TURNS])
    decisions = [
        t
        for t in sorted(picked[SUMMARY_HEAD_TURNS:])
        if any(DECISION_CUE.search(sentences[i].text) for i in kept[t])
    ]
    task = " ".join(str(state.get("task", "")).split())
    outcome = " ".join(str(state.get("outcome", "")).split())
    facts = _unique([_clip(" ".join(str(f).split()), ITEM_CHARS) for f in state.get("facts", [])])
    errors = _unique([_clip(e, ITEM_CHARS) for e in tool_errors(state.get("tool_state", {}))])

    summarizer_path = settings.SESSION_SUMMARIZER
    if summarizer_path:
        summarize: Callable[..., str] = import_string(summarizer_path)
        summary = summarize(state=state, lines=lines, picked=[lines[t] for t in sorted(picked)])
    else:
        parts = [f"Task: {task}"] if task else []
        parts += [kept_line(t) for t in head]
        if terms:
            parts.append(f"Topics: {', '.join(terms)}")
        if outcome:
            parts.append(f"Outcome: {outcome}")
        summary = "\n".join(parts)
    return Extraction(
        summary=_clip(summary.strip(), SUMMARY_MAX_CHARS),
        key_facts=facts,
        decisions=[kept_line(t) for t in decisions],
        tool_errors=errors[:MAX_TOOL_ERRORS],
        salient=[kept_line(t) for t in sorted(set(picked[SUMMARY_HEAD_TURNS:]) - set(decisions))],
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
