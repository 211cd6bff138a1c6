"""Context benchmark: ``python bench/context.py [--part quality latency] [--fit]``.

- ``quality``: LoCoMo (10 conversations as agents, every turn stored with the service's defaults,
  near-duplicate merging on), questions of categories 1-4. Each question is asked twice through
  ``memory.selectors.memory_context`` with its defaults: of its own conversation's agent (on
  topic: session recall@10 of the memories inside the context, against plain hybrid search at
  limit 10) and of the next conversation's agent (off topic: the share of questions whose context
  holds no memory at all). Then the trade-off curve: both figures for several relevance
  thresholds, from the same searches. ``--fit`` also chooses the relevance model's constants
  (memory.selectors.RELEVANCE_*; see fit_relevance) from those searches.
- ``latency``: POST /memory/context beside POST /memory/search over HTTP through gunicorn as
  deployed (``tests/api/live_server.py``, keep-alive, one client), with a 50-turn session, at
  10^4 and 10^5 memory items of one agent (rows written straight to the DB as in
  bench/search.py, real LoCoMo texts with random unit vectors; queries are real questions).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from retrieval import (  # noqa: E402 - after the path set-up
    _evidence,
    _print_table,
    locomo_conversations,
    locomo_items,
    locomo_questions,
    setup_django,
    store_all,
)

SEARCH_LIMIT = 10
THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
TARGET_RECALL_GAP = 0.02
TARGET_ABSTENTION = 0.90
CONTEXT_BUDGET = 4_000
LATENCY_AGENT = "bench"
SESSION_TURNS = 50
TARGET_P95_GAP_MS = 5.0  # tokens: room for ten turns whatever the threshold keeps


def _sessions(ids: list[str]) -> set[int]:
    return {s for s, _ in _evidence(ids)}


def part_quality(args: argparse.Namespace) -> None:
    from memory.context import memory_context
    from memory.selectors import memory_search, relevance

    conversations = locomo_conversations()
    report = store_all(locomo_items(conversations), "dia_id", "locomo")
    agents = sorted({q[0] for q in locomo_questions(conversations)})
    questions = locomo_questions(conversations)
    other = {agent: agents[(i + 1) % len(agents)] for i, agent in enumerate(agents)}

    # Every figure of the curve comes from these hits: (relevance evidence, in an evidence
    # session?, an evidence turn?) of the top 10 of each question, on and off topic.
    on_topic: list[list[tuple[float, float, bool, bool]]] = []
    off_topic: list[list[tuple[float, float]]] = []
    context_recall = context_abstained = 0
    for agent, question, evidence in questions:
        sessions = {s for s, _ in evidence}
        hits = memory_search(query=question, agent_id=agent, limit=SEARCH_LIMIT)
        on_topic.append(
            [
                (
                    hit.cosine,
                    hit.term_share,
                    bool(_sessions(report.ids_of[str(hit.item.id)]) & sessions),
                    bool(_evidence(report.ids_of[str(hit.item.id)]) & evidence),
                )
                for hit in hits
            ]
        )
        away = memory_search(query=question, agent_id=other[agent], limit=SEARCH_LIMIT)
        off_topic.append([(hit.cosine, hit.term_share) for hit in away])
        own = memory_context(query=question, agent_id=agent, token_budget=CONTEXT_BUDGET)
        context_recall += any(
            _sessions(report.ids_of[str(m.hit.item.id)]) & sessions for m in own.memories
        )
        foreign = memory_context(query=question, agent_id=other[agent], token_budget=CONTEXT_BUDGET)
        context_abstained += not foreign.memories

    if args.fit:
        fit_relevance(on_topic, off_topic)
    if args.dump:
        Path(args.dump).write_text(json.dumps({"on_topic": on_topic, "off_topic": off_topic}))

    n = len(questions)
    baseline = sum(any(h[2] for h in hits) for hits in on_topic) / n
    print(
        f"\n## LoCoMo context: {len(conversations)} agents, {report.stored:,} items stored "
        f"({report.duplicates} merged), {n:,} questions of categories 1-4\n"
    )
    rows = []
    for threshold in THRESHOLDS:
        found = sum(
            any(s and relevance(c, t) >= threshold for c, t, s, _ in hits) for hits in on_topic
        )
        empty = sum(all(relevance(c, t) < threshold for c, t in hits) for hits in off_topic)
        rows.append((f"{threshold:.1f}", f"{found / n:.3f}", f"{empty / n:.3f}"))
    _print_table(("min relevance", "on-topic session R@10", "off-topic abstention"), rows)
    recall, abstention = context_recall / n, context_abstained / n  # of the service's defaults
    print()
    _print_table(
        ("figure", "value", "target", "met"),
        [
            ("hybrid search, limit 10: session R@10", f"{baseline:.3f}", "", ""),
            (
                "context (defaults): session R@10 of its memories",
                f"{recall:.3f}",
                f">= {baseline - TARGET_RECALL_GAP:.3f}",
                "yes" if recall >= baseline - TARGET_RECALL_GAP else "NO",
            ),
            (
                "context (defaults), off topic: share with no memory",
                f"{abstention:.3f}",
                f">= {TARGET_ABSTENTION:.2f}",
                "yes" if abstention >= TARGET_ABSTENTION else "NO",
            ),
        ],
    )


def fit_relevance(
    on_topic: Sequence[Sequence[tuple[float, float, bool, bool]]],
    off_topic: Sequence[Sequence[tuple[float, float]]],
) -> None:
    """Choose the term weight and midpoint of memory.selectors.relevance, then fit its slope.

    A question's context keeps its hits whose evidence (cosine + w * term share) reaches the
    midpoint. For each w, the midpoint with the largest margin over both targets (on-topic
    session recall within TARGET_RECALL_GAP of plain search, off-topic abstention at least
    TARGET_ABSTENTION); then the slope by logistic regression (Newton's method, classes weighed
    alike) of evidence turns against off-topic hits, the midpoint at relevance 0.5."""
    n = len(on_topic)
    floor = sum(any(h[2] for h in hits) for hits in on_topic) / n - TARGET_RECALL_GAP
    rows, best = [], (-1.0, 0.0, 0.0)
    for weight in np.arange(0.0, 1.55, 0.1):
        on = np.array(
            [max((c + weight * t for c, t, s, _ in h if s), default=-9.0) for h in on_topic]
        )
        off = np.array([max((c + weight * t for c, t in h), default=-9.0) for h in off_topic])
        margin, midpoint, recall, abstention = max(
            (
                min((on >= m).mean() - floor, (off < m).mean() - TARGET_ABSTENTION),
                m,
                (on >= m).mean(),
                (off < m).mean(),
            )
            for m in np.arange(0.3, 1.2, 0.005)
        )
        rows.append((f"{weight:.1f}", f"{midpoint:.3f}", f"{recall:.3f}", f"{abstention:.3f}"))
        if margin > best[0]:
            best = (margin, float(weight), float(midpoint))
    print("\n## the relevance model: each term weight at its best midpoint\n")
    _print_table(("term weight", "midpoint", "on-topic session R@10", "off-topic abstention"), rows)
    _, weight, midpoint = best
    positives = [c + weight * t - midpoint for hits in on_topic for c, t, _, e in hits if e]
    negatives = [c + weight * t - midpoint for hits in off_topic for c, t in hits]
    x = np.array(positives + negatives)
    y = np.array([1.0] * len(positives) + [0.0] * len(negatives))
    w_class = np.where(y == 1, 0.5 / len(positives), 0.5 / len(negatives))
    slope = 1.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-slope * x))
        slope += (w_class * (y - p) * x).sum() / (w_class * p * (1 - p) * x * x).sum()
    print(
        f"\nchosen: RELEVANCE_TERM_WEIGHT = {weight:.1f}, RELEVANCE_MIDPOINT = {midpoint:.3f}, "
        f"RELEVANCE_SLOPE = {slope:.1f} (fitted on {len(positives):,} evidence turns and "
        f"{len(negatives):,} off-topic hits)"
    )


def part_latency(args: argparse.Namespace, data_dir: str) -> None:
    """Context beside search over HTTP, keep-alive, one client, alternating requests."""
    import httpx
    from search import build_index, load_items, locomo_texts

    from memory.vector_index import reset_vector_index
    from tests.api.live_server import live_server

    turns, questions = locomo_texts()
    rows = []
    for size in args.sizes:
        load_items(size, [LATENCY_AGENT], turns, seed=size)
        # Built here and let go: the web worker takes this free shard folder and catches up,
        # as a restarted one would, instead of building the index inside its first request.
        print(f"  index of {size:,} items built in {build_index():.0f} s", file=sys.stderr)
        reset_vector_index()
        # One web worker: each would build its own copy of the index before its first answer.
        with live_server(Path(data_dir), WEB_CONCURRENCY="1") as server:
            headers = {"Authorization": f"Bearer {server.api_key}"}
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=3600) as http:
                messages = [
                    {"role": "user" if i % 2 else "assistant", "content": turns[i]}
                    for i in range(SESSION_TURNS)
                ]
                started = http.post(
                    "/session/start", json={"agent_id": LATENCY_AGENT, "messages": messages}
                )
                started.raise_for_status()
                sid = started.json()["session_id"]
                search_ms: list[float] = []
                context_ms: list[float] = []
                for i in range(args.warmup + args.requests):
                    query = questions[i % len(questions)]
                    for path, body, times in (
                        ("/memory/search", {"limit": SEARCH_LIMIT}, search_ms),
                        ("/memory/context", {"token_budget": 2_000, "session_id": sid}, context_ms),
                    ):
                        begin = time.perf_counter()
                        answer = http.post(
                            path, json={"agent_id": LATENCY_AGENT, "query": query, **body}
                        )
                        elapsed = (time.perf_counter() - begin) * 1e3
                        answer.raise_for_status()
                        if i >= args.warmup:
                            times.append(elapsed)
        for name, times in (
            ("POST /memory/search", search_ms),
            ("POST /memory/context", context_ms),
        ):
            p50, p95 = np.percentile(times, [50, 95])
            rows.append((f"{size:,}", name, f"{p50:.1f}", f"{p95:.1f}"))
        gap = np.percentile(context_ms, 95) - np.percentile(search_ms, 95)
        rows.append((f"{size:,}", "context p95 - search p95", "", f"{gap:+.1f}"))
    print(
        f"\n## HTTP through gunicorn (1 worker, keep-alive, one client), a {SESSION_TURNS}-turn "
        f"session, {args.requests} requests each, load {_load()}\n"
    )
    _print_table(("items", "operation", "p50 ms", "p95 ms"), rows)
    print(
        "\nItems are LoCoMo turns (numbered to be distinct) with random unit vectors, written "
        "straight to the DB; queries are LoCoMo questions, embedded per request. Target: the "
        f"context's p95 at most {TARGET_P95_GAP_MS:.0f} ms above the search's."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["quality", "latency"])
    parser.add_argument("--fit", action="store_true", help="fit the relevance weights")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dump", help="write every hit's relevance evidence to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-context-") as data_dir:
        setup_django(data_dir, keep_near_duplicates=False)
        print(f"# bench/context.py on {platform.node()}, load {_load()}")
        if "quality" in args.part:
            part_quality(args)
        if "latency" in args.part:
            part_latency(args, data_dir)


def _load() -> str:
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
