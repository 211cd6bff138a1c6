"""Context benchmark: ``python bench/context.py [--part quality latency] [--fit]``.

- ``quality``: LoCoMo (10 conversations as agents, every turn stored with the service's defaults,
  near-duplicate merging on), questions of categories 1-4. Each question is asked twice through
  ``memory.selectors.memory_context`` with its defaults: of its own conversation's agent (on
  topic: session recall@10 of the memories inside the context, against plain hybrid search at
  limit 10) and of the next conversation's agent (off topic: the share of questions whose context
  holds no memory at all). Then the trade-off curve: both figures for several relevance
  thresholds, from the same searches. ``--fit`` also fits the relevance model's weights
  (memory.selectors.RELEVANCE_*) by logistic regression: positives are the on-topic hits that are
  evidence turns, negatives every off-topic hit; SciFact's relevant abstracts of the train
  queries check that the fitted relevance keeps what another set calls relevant.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
CONTEXT_BUDGET = 4_000  # tokens: room for ten turns whatever the threshold keeps


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
    """Logistic regression (Newton's method) of evidence turn vs off-topic hit."""
    positives = [(c, t) for hits in on_topic for c, t, _, turn in hits if turn]
    negatives = [(c, t) for hits in off_topic for c, t in hits]
    x = np.array([(1.0, c, t) for c, t in positives + negatives])
    y = np.array([1.0] * len(positives) + [0.0] * len(negatives))
    # Each class weighs half, so the fit does not just learn that most hits are off topic.
    w_class = np.where(y == 1, 0.5 / len(positives), 0.5 / len(negatives))
    beta = np.zeros(3)
    for _ in range(50):
        p = 1 / (1 + np.exp(-x @ beta))
        gradient = x.T @ (w_class * (y - p))
        hessian = (x * (w_class * p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(3)
        beta += np.linalg.solve(hessian, gradient)
    print(
        f"\nfit on {len(positives):,} evidence hits and {len(negatives):,} off-topic hits: "
        f"RELEVANCE_BIAS = {beta[0]:.2f}, RELEVANCE_PER_COSINE = {beta[1]:.2f}, "
        f"RELEVANCE_PER_TERM_SHARE = {beta[2]:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["quality", "latency"])
    parser.add_argument("--fit", action="store_true", help="fit the relevance weights")
    parser.add_argument("--dump", help="write every hit's relevance evidence to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-context-") as data_dir:
        setup_django(data_dir, keep_near_duplicates=False)
        print(f"# bench/context.py on {platform.node()}, load {_load()}")
        if "quality" in args.part:
            part_quality(args)


def _load() -> str:
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()


__all__: list[Any] = []
