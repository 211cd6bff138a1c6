"""Retrieval quality benchmark: ``python bench/retrieval.py [--datasets locomo,scifact]``.

Measured through the service's own code: ``memory.services.memory_store_many`` stores (embeds,
deduplicates, indexes) and ``memory.selectors.memory_search`` searches, on a throwaway SQLite
database and qdrant-edge shard in a fresh temporary data folder. Each dataset is one function
that prints one table, with every search mode and the targets beside.

- ``locomo``: LoCoMo (``/work/shared/data/locomo/locomo10.json``). Each conversation is an
  agent, each turn a memory item ``"[{session date time}] {speaker}: {text}"`` of its
  session (``session_id`` ``session_N``, stored in order). Questions of
  categories 1-4 (multi-hop, temporal, open-domain, single-hop) with their evidence turns:
  turn-level recall@k (an evidence turn in the top k) and session-level recall@k (a retrieved
  turn in an evidence turn's session), k = 5, 10, 20.
- ``scifact``: BEIR SciFact (``/work/shared/data/scifact``), one agent, each abstract
  ``title + " " + text``; the train queries and qrels: nDCG@10 (binary relevance) and
  recall@100 (100 is ``memory_search``'s largest limit). ``--scifact-docs N`` stores only the
  first N abstracts (corpus order) and then keeps only the queries whose relevant abstracts are
  all stored.

It runs twice (``--merging off,on``): with near-duplicate merging off (MEMORY_NEAR_DUPLICATE=1.01,
every turn and abstract is stored; exact duplicates, same agent and normalised text, are still
merged) and with the service's default merging, as users run it; a merged point counts for every
input merged into it. LoCoMo also prints the strict turn recall@10, Hit@1 and nDCG@5, and every
figure per question category. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a plain script from anywhere: make the project importable.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data"  # beside the clone, as the tests read it
LOCOMO_FILE = DATA / "locomo" / "locomo10.json"
SCIFACT_DIR = DATA / "scifact"
MODES = ("hybrid", "dense", "sparse")
DEFAULT_MODE = "hybrid"
# LoCoMo also runs a hybrid search that asks for its hits spread over sessions, as an agent
# looking for the conversations rather than the turns would (a per-request choice).
SPREAD = "hybrid, session_diversity 1"
SPREAD_DIVERSITY = 1.0
STORE_BATCH = 256  # the API's MAX_BATCH
NEAR_DUPLICATE_OFF = "1.01"  # a cosine similarity never reaches it: every item is stored
LOCOMO_CATEGORIES = (1, 2, 3, 4)  # 5 (adversarial) has no answer in the conversation
LOCOMO_KS = (5, 10, 20)
TARGET_TURN_R10 = 0.80
TARGET_STRICT_R10 = 0.74
TARGET_SESSION_R10 = 0.96
TARGET_SCIFACT_NDCG10 = 0.76
LOCOMO_CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SCIFACT_LIMIT = 100  # memory_search's largest limit
DIA_ID = re.compile(r"D(\d+):(\d+)")


def setup_django(data_dir: str, *, keep_near_duplicates: bool = True) -> None:
    """Point the base settings at a throwaway data folder, then migrate it. With
    keep_near_duplicates every item is stored (recall benches); without, the service's own
    merging applies (throughput benches)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "ferrum_memory.settings.base"
    os.environ["FERRUM_DATA_DIR"] = data_dir
    os.environ["DJANGO_SECRET_KEY"] = "bench"
    if keep_near_duplicates:
        os.environ["MEMORY_NEAR_DUPLICATE"] = NEAR_DUPLICATE_OFF
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    for name in ("DATABASE_URL", "SQLITE_PATH", "QDRANT_URL", "REDIS_URL"):
        os.environ.pop(name, None)  # measure the embedded stack, whatever the shell says
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def cache_embeddings(path: Path) -> None:
    """Keep every vector the Embedder makes in an SQLite file at `path`, keyed by model (and
    model path), kind (document, item, query or query tokens) and text, and answer from it on
    later runs: reruns of the quality benches then embed nothing (bench/levers.py fills the
    same file). The service's code is unchanged; only its embedder's methods are wrapped.
    Stores then run faster than the service does, so their items/s are no store throughput."""
    import pickle

    import numpy as np

    from memory.embeddings import Embedder, ItemVectors

    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=120, check_same_thread=False)
    db.execute("CREATE TABLE IF NOT EXISTS vector (key BLOB PRIMARY KEY, value BLOB)")
    embed_documents, embed_query = Embedder.embed_documents, Embedder.embed_query
    embed_items, embed_query_tokens = Embedder.embed_items, Embedder.embed_query_tokens

    def key(self: Embedder, kind: str, text: str) -> bytes:
        # A model read from FASTEMBED_MODEL_PATH is another model under the same name.
        model = f"{self.model_name}\0{self._model_path}" if self._model_path else self.model_name
        if kind.startswith("query") and self.int8_queries:
            model += "\0int8 queries"  # another model for queries (Embedder.embed_query)
        return hashlib.sha256(f"{model}\0{kind}\0{text}".encode()).digest()

    def cached(
        self: Embedder,
        kind: str,
        texts: list[str],
        embed: Any,
        dump: Any = lambda v: v.tobytes(),
        load: Any = lambda b: np.frombuffer(b, dtype=np.float32).copy(),
    ) -> list[Any]:
        """Each text's value: `load` of what the file holds, or embedded by `embed(missing)`
        (one value a text, kept as `dump` gives it)."""
        keys = [key(self, kind, text) for text in texts]
        found: dict[bytes, Any] = {}
        for offset in range(0, len(keys), 500):
            chunk = keys[offset : offset + 500]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(f"SELECT key, value FROM vector WHERE key IN ({marks})", chunk)
            found.update((k, load(v)) for k, v in rows)
        missing = sorted({i for i, k in enumerate(keys) if k not in found})
        if missing:
            fresh = embed([texts[i] for i in missing])
            pairs = list(zip([keys[i] for i in missing], fresh, strict=True))
            db.executemany(
                "INSERT OR REPLACE INTO vector VALUES (?, ?)", [(k, dump(v)) for k, v in pairs]
            )
            db.commit()
            found.update(pairs)
        return [found[k] for k in keys]

    def cached_documents(self: Embedder, texts: list[str]) -> Any:
        if not texts:
            return embed_documents(self, texts)
        vectors = cached(self, "document", texts, lambda some: list(embed_documents(self, some)))
        return np.stack(vectors).astype(np.float32)

    def cached_query(self: Embedder, text: str) -> Any:
        return cached(self, "query", [text], lambda some: [embed_query(self, some[0])])[0]

    def cached_items(self: Embedder, texts: list[str]) -> Any:
        if not texts:
            return embed_items(self, texts)

        def embed(some: list[str]) -> list[Any]:
            made = embed_items(self, some)
            return list(zip(made.vectors, made.sentences, made.tokens, strict=True))

        rows = cached(self, "item", texts, embed, pickle.dumps, pickle.loads)
        vectors, sentence_blobs, token_blobs = zip(*rows, strict=True)
        return ItemVectors(np.stack(vectors), list(sentence_blobs), list(token_blobs))

    def cached_query_tokens(self: Embedder, text: str) -> Any:
        embed = lambda some: [embed_query_tokens(self, some[0])]  # noqa: E731
        return cached(self, "query tokens", [text], embed, pickle.dumps, pickle.loads)[0]

    Embedder.embed_documents = cached_documents  # type: ignore[method-assign]
    Embedder.embed_query = cached_query  # type: ignore[method-assign]
    Embedder.embed_items = cached_items  # type: ignore[method-assign]
    Embedder.embed_query_tokens = cached_query_tokens  # type: ignore[method-assign]


@dataclass
class StoreReport:
    items: int = 0
    stored: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    # point id -> the bench's own ids of every input merged into that point
    ids_of: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


def store_all(items: Sequence[dict[str, Any]], key: str, label: str) -> StoreReport:
    """Store `items` with memory_store_many in batches; each item's metadata[key] is the
    bench's own id, mapped back from the point id it ended up in."""
    from memory.services import memory_store_many

    report = StoreReport()
    start = time.perf_counter()
    for offset in range(0, len(items), STORE_BATCH):
        batch = items[offset : offset + STORE_BATCH]
        for given, result in zip(batch, memory_store_many(items=batch), strict=True):
            report.ids_of[str(result.item.id)].append(given["metadata"][key])
            report.duplicates += bool(result.duplicate)
            if not result.indexed:
                raise RuntimeError("the vector index was unavailable during the bench")
        done = offset + len(batch)
        rate = done / (time.perf_counter() - start)
        print(f"  {label}: stored {done:,}/{len(items):,} ({rate:.1f}/s)", file=sys.stderr)
    report.seconds = time.perf_counter() - start
    # What the beat's count does within its interval: search by the word pieces' IDF.
    from memory.services import memory_count_word_pieces

    counted = time.perf_counter()
    memory_count_word_pieces()
    print(
        f"  {label}: word pieces counted in {time.perf_counter() - counted:.1f} s", file=sys.stderr
    )
    report.items = len(items)
    report.stored = report.items - report.duplicates
    return report


def search_ids(
    query: str, agent_id: str, search: str, limit: int, ids_of: dict[str, list[str]]
) -> list[list[str]]:
    """The bench ids behind each hit, in rank order; `search` is a mode, or SPREAD."""
    from memory.selectors import memory_search

    options = {"session_diversity": SPREAD_DIVERSITY} if search == SPREAD else {"mode": search}
    hits = memory_search(query=query, agent_id=agent_id, limit=limit, **options)
    return [ids_of[str(hit.item.id)] for hit in hits]


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """A Markdown table with padded columns, readable as text too."""
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def _hybrid_beats(scores: dict[str, float]) -> str:
    """Whether the default mode beats the best single mode on one metric, and by how much."""
    best_single = max((m for m in MODES if m != DEFAULT_MODE), key=lambda m: scores[m])
    margin = scores[DEFAULT_MODE] - scores[best_single]
    return f"{_verdict(margin > 0)} ({margin:+.3f} vs {best_single})"


# LoCoMo ------------------------------------------------------------------------------------


def _evidence(raw: Iterable[str]) -> set[tuple[int, int]]:
    """(session, turn) of each evidence id; a few labels hold several ids in one string."""
    return {(int(s), int(t)) for text in raw for s, t in DIA_ID.findall(text)}


def locomo_conversations(count: int | None = None) -> list[dict[str, Any]]:
    return json.loads(LOCOMO_FILE.read_text())[:count]


def locomo_agent(conv: dict[str, Any]) -> str:
    return f"locomo-{conv['sample_id']}"


def locomo_items(conversations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every turn of every conversation as a memory item of the conversation's agent."""
    items: list[dict[str, Any]] = []
    for conv in conversations:
        agent = locomo_agent(conv)
        talk = conv["conversation"]
        for key, turns in talk.items():
            match = re.fullmatch(r"session_(\d+)", key)
            if not match or not isinstance(turns, list):
                continue
            when = talk[f"{key}_date_time"]
            for turn in turns:
                items.append(
                    {
                        "agent_id": agent,
                        # A conversation's session, as a chat client stores its turns: in
                        # order, so each turn has its place (the neighbour context reads it).
                        "session_id": key,
                        "content": f"[{when}] {turn['speaker']}: {turn['text']}",
                        "kind": "episodic",
                        "tags": [key],
                        "metadata": {
                            "dia_id": f"{agent}/{turn['dia_id']}",
                            "session": int(match[1]),
                        },
                    }
                )
    return items


def locomo_questions(
    conversations: Sequence[dict[str, Any]],
) -> list[tuple[str, str, set[tuple[int, int]]]]:
    """(agent, question, evidence turns) of categories 1-4, the questions with evidence."""
    return [q[:3] for q in locomo_questions_by_category(conversations)]


def locomo_questions_by_category(
    conversations: Sequence[dict[str, Any]],
) -> list[tuple[str, str, set[tuple[int, int]], int]]:
    """(agent, question, evidence turns, category) of categories 1-4 with evidence."""
    questions = [
        (locomo_agent(conv), qa["question"], _evidence(qa.get("evidence", [])), qa["category"])
        for conv in conversations
        for qa in conv["qa"]
        if qa.get("category") in LOCOMO_CATEGORIES
    ]
    return [q for q in questions if q[2]]  # a handful carry no usable evidence id


# The turn-level figures of one question, from its ranked hits (each hit: the evidence turns it
# holds; a merged point holds several) and its evidence turns.
LOCOMO_FIGURES = ("turn R@10", "strict R@10", "session R@10", "Hit@1", "nDCG@5")


def locomo_figures(
    ranked: Sequence[set[tuple[int, int]]], evidence: set[tuple[int, int]]
) -> dict[str, float]:
    sessions = {s for s, _ in evidence}
    top10 = set().union(*ranked[:10]) if ranked else set()
    gains = [bool(turns & evidence) for turns in ranked[:5]]
    return {
        "turn R@10": float(bool(top10 & evidence)),
        "strict R@10": len(top10 & evidence) / len(evidence),
        "session R@10": float(any(s in sessions for s, _ in top10)),
        "Hit@1": float(bool(gains[:1] and gains[0])),
        "nDCG@5": _ndcg_at(gains, len(evidence), 5),
    }


def part_locomo(args: argparse.Namespace) -> None:
    conversations = locomo_conversations(args.locomo_conversations)
    prefix = args.agent_prefix
    items = [
        {**item, "agent_id": prefix + item["agent_id"]} for item in locomo_items(conversations)
    ]
    report = store_all(items, "dia_id", "locomo")
    questions = locomo_questions_by_category(conversations)
    top = max(LOCOMO_KS)
    searches = (*MODES, SPREAD)
    turn_hits: dict[str, dict[int, int]] = {m: dict.fromkeys(LOCOMO_KS, 0) for m in searches}
    session_hits: dict[str, dict[int, int]] = {m: dict.fromkeys(LOCOMO_KS, 0) for m in searches}
    # search -> category (0: all) -> figure -> sum over the category's questions
    sums: dict[str, dict[int, dict[str, float]]] = {
        m: {c: dict.fromkeys(LOCOMO_FIGURES, 0.0) for c in (0, *LOCOMO_CATEGORIES)}
        for m in searches
    }
    counts = {c: sum(q[3] == c for q in questions) for c in LOCOMO_CATEGORIES} | {0: len(questions)}
    latency: dict[str, float] = {}
    for mode in searches:
        start = time.perf_counter()
        for agent, question, evidence, category in questions:
            ranked = [
                _evidence(ids)
                for ids in search_ids(question, prefix + agent, mode, top, report.ids_of)
            ]
            sessions = {s for s, _ in evidence}
            for k in LOCOMO_KS:
                turn_hits[mode][k] += any(turns & evidence for turns in ranked[:k])
                session_hits[mode][k] += any(
                    any(s in sessions for s, _ in turns) for turns in ranked[:k]
                )
            for name, value in locomo_figures(ranked, evidence).items():
                sums[mode][0][name] += value
                sums[mode][category][name] += value
        latency[mode] = (time.perf_counter() - start) / len(questions) * 1e3

    n = len(questions)
    turn = {m: {k: turn_hits[m][k] / n for k in LOCOMO_KS} for m in searches}
    session = {m: {k: session_hits[m][k] / n for k in LOCOMO_KS} for m in searches}
    figures = {
        m: {c: {f: v / max(counts[c], 1) for f, v in by.items()} for c, by in cats.items()}
        for m, cats in sums.items()
    }
    print(
        f"\n## LoCoMo ({args.run_label}): {len(conversations)} conversations (agents), "
        f"{report.items:,} turns stored in {report.seconds:.0f} s "
        f"({report.items / report.seconds:.1f}/s, {report.duplicates} merged), {n:,} questions "
        f"of categories {', '.join(map(str, LOCOMO_CATEGORIES))}\n"
    )
    header = (
        "mode",
        *(f"turn R@{k}" for k in LOCOMO_KS),
        *(f"session R@{k}" for k in LOCOMO_KS),
        "strict R@10",
        "Hit@1",
        "nDCG@5",
        "ms/query",
    )
    rows = [
        (
            mode + (" (default)" if mode == DEFAULT_MODE else ""),
            *(f"{turn[mode][k]:.3f}" for k in LOCOMO_KS),
            *(f"{session[mode][k]:.3f}" for k in LOCOMO_KS),
            *(f"{figures[mode][0][f]:.3f}" for f in ("strict R@10", "Hit@1", "nDCG@5")),
            f"{latency[mode]:.1f}",
        )
        for mode in searches
    ]
    _print_table(header, rows)
    print()
    by_category = [
        (
            f"{LOCOMO_CATEGORY_NAMES[c]} ({counts[c]})",
            mode,
            *(f"{figures[mode][c][f]:.3f}" for f in LOCOMO_FIGURES),
        )
        for c in LOCOMO_CATEGORIES
        for mode in searches
    ]
    _print_table(("category (questions)", "mode", *LOCOMO_FIGURES), by_category)
    print()
    default = figures[DEFAULT_MODE][0]
    checks = [
        (
            f"turn recall@10 ({DEFAULT_MODE})",
            f"{turn[DEFAULT_MODE][10]:.3f}",
            f">= {TARGET_TURN_R10:.2f}",
            _verdict(turn[DEFAULT_MODE][10] >= TARGET_TURN_R10),
        ),
        (
            f"strict turn recall@10 ({DEFAULT_MODE})",
            f"{default['strict R@10']:.3f}",
            f">= {TARGET_STRICT_R10:.2f}",
            _verdict(default["strict R@10"] >= TARGET_STRICT_R10),
        ),
        (
            f"session recall@10 ({DEFAULT_MODE})",
            f"{session[DEFAULT_MODE][10]:.3f}",
            f">= {TARGET_SESSION_R10:.2f}",
            _verdict(session[DEFAULT_MODE][10] >= TARGET_SESSION_R10),
        ),
        *(
            (
                f"{name}: default beats the best single mode",
                "",
                "> best single",
                _hybrid_beats({m: figures[m][0][name] for m in MODES}),
            )
            for name in LOCOMO_FIGURES
        ),
        (
            f"session recall@10 ({SPREAD}, asked for)",
            f"{session[SPREAD][10]:.3f}",
            f">= {TARGET_SESSION_R10:.2f}",
            _verdict(session[SPREAD][10] >= TARGET_SESSION_R10),
        ),
    ]
    _print_table(("check", "figure", "target", "met"), checks)
    print(
        "\nturn R@k: share of questions with an evidence turn in the top k; session R@k: with a "
        "top-k turn from an evidence turn's session; strict R@10: the share of each question's "
        "evidence turns in the top 10; Hit@1: the first hit is an evidence turn; nDCG@5: binary "
        "relevance of the evidence turns. ms/query includes embedding the query."
    )


# SciFact -----------------------------------------------------------------------------------


def _ndcg_at(ranked: Sequence[bool], relevant: int, k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, hit in enumerate(ranked[:k]) if hit)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(relevant, k)))
    return dcg / ideal


def part_scifact(args: argparse.Namespace) -> None:
    with (SCIFACT_DIR / "corpus.jsonl").open() as lines:
        corpus = [json.loads(line) for line in lines]
    subset = args.scifact_docs is not None and args.scifact_docs < len(corpus)
    corpus = corpus[: args.scifact_docs] if subset else corpus
    stored_ids = {doc["_id"] for doc in corpus}
    with (SCIFACT_DIR / "queries.jsonl").open() as lines:
        query_text = {q["_id"]: q["text"] for q in map(json.loads, lines)}
    qrels: dict[str, set[str]] = defaultdict(set)
    with (SCIFACT_DIR / "qrels" / "train.tsv").open() as lines:
        next(lines)  # header
        for line in lines:
            query_id, doc_id, score = line.split("\t")
            if int(score) > 0:
                qrels[query_id].add(doc_id)
    all_queries = len(qrels)
    queries = {q: rel for q, rel in qrels.items() if rel <= stored_ids}

    agent = args.agent_prefix + "scifact"
    items = [
        {
            "agent_id": agent,
            "content": f"{doc['title']} {doc['text']}".strip(),
            "kind": "semantic",
            "metadata": {"doc_id": doc["_id"]},
        }
        for doc in corpus
    ]
    report = store_all(items, "doc_id", "scifact")

    ndcg: dict[str, float] = {}
    recall: dict[str, float] = {}
    latency: dict[str, float] = {}
    for mode in MODES:
        start = time.perf_counter()
        ndcg_sum = recall_sum = 0.0
        for query_id, relevant in queries.items():
            ranked = search_ids(query_text[query_id], agent, mode, SCIFACT_LIMIT, report.ids_of)
            hits = [bool(relevant & set(ids)) for ids in ranked]
            found = set().union(*map(set, ranked)) if ranked else set()
            ndcg_sum += _ndcg_at(hits, len(relevant), 10)
            recall_sum += len(relevant & found) / len(relevant)
        latency[mode] = (time.perf_counter() - start) / len(queries) * 1e3
        ndcg[mode] = ndcg_sum / len(queries)
        recall[mode] = recall_sum / len(queries)

    scope = (
        f"SUBSET: the first {len(corpus):,} of 5,183 abstracts, and only the {len(queries)} of "
        f"{all_queries} train queries whose relevant abstracts are all stored (fewer "
        "distractors than the full corpus: not comparable with published figures)"
        if subset
        else f"all {len(corpus):,} abstracts, all {len(queries)} train queries"
    )
    print(
        f"\n## SciFact ({args.run_label}): {scope}; stored in {report.seconds:.0f} s "
        f"({report.items / report.seconds:.1f}/s, {report.duplicates} merged as exact "
        "duplicates)\n"
    )
    rows = [
        (
            mode + (" (default)" if mode == DEFAULT_MODE else ""),
            f"{ndcg[mode]:.3f}",
            f"{recall[mode]:.3f}",
            f"{latency[mode]:.1f}",
        )
        for mode in MODES
    ]
    _print_table(("mode", "nDCG@10", "recall@100", "ms/query"), rows)
    print()
    checks = [
        (
            f"nDCG@10 ({DEFAULT_MODE})",
            f"{ndcg[DEFAULT_MODE]:.3f}",
            f">= {TARGET_SCIFACT_NDCG10:.2f}",
            _verdict(ndcg[DEFAULT_MODE] >= TARGET_SCIFACT_NDCG10),
        ),
        ("nDCG@10: default beats the best single mode", "", "> best single", _hybrid_beats(ndcg)),
        (
            "recall@100: default beats the best single mode",
            "",
            "> best single",
            _hybrid_beats(recall),
        ),
    ]
    _print_table(("check", "figure", "target", "met"), checks)
    print("\nnDCG@10 with binary relevance (qrels score > 0). ms/query includes embedding it.")


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {
    "locomo": part_locomo,
    "scifact": part_scifact,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--datasets",
        default="locomo,scifact",
        help=f"comma-separated, of: {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--scifact-docs", type=int, default=None, help="store only the first N abstracts"
    )
    parser.add_argument(
        "--locomo-conversations", type=int, default=None, help="only the first N conversations"
    )
    parser.add_argument(
        "--merging",
        default="off,on",
        help="comma-separated runs: off (every item stored), on (the service's default "
        "near-duplicate merging)",
    )
    parser.add_argument(
        "--embed-cache",
        type=Path,
        default=None,
        help="an SQLite file of dense vectors to reuse and fill (e.g. var/embeddings.sqlite, "
        "which bench/levers.py fills): reruns embed nothing; store rates then mean nothing",
    )
    args = parser.parse_args(argv)
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()]
    unknown = [name for name in datasets if name not in PARTS]
    if unknown:
        parser.error(f"unknown dataset(s): {', '.join(unknown)}")
    runs = [run.strip() for run in args.merging.split(",") if run.strip()]
    if not runs or set(runs) - {"off", "on"}:
        parser.error("--merging takes off, on or both")
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-retrieval-") as data_dir:
        os.environ.pop("MEMORY_NEAR_DUPLICATE", None)  # the service's default, whatever the shell
        setup_django(data_dir, keep_near_duplicates=False)
        if args.embed_cache:
            cache_embeddings(args.embed_cache)
        from django.conf import settings

        service_default = settings.MEMORY_NEAR_DUPLICATE

        print(
            f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
            f"model {settings.FASTEMBED_MODEL}, {settings.FASTEMBED_THREADS} embedding "
            "thread(s); SQLite + qdrant-edge in a temporary folder"
        )
        for run in runs:
            # Each run stores everything again under its own agent ids, in the same shard (BM25's
            # IDF counts both runs' copies, which leaves its ratios about where they were).
            threshold = float(NEAR_DUPLICATE_OFF) if run == "off" else service_default
            settings.MEMORY_NEAR_DUPLICATE = threshold
            args.agent_prefix = f"merging-{run}/"
            args.run_label = f"near-duplicate merging {run}, MEMORY_NEAR_DUPLICATE={threshold}" + (
                " (the service's default)" if run == "on" else " (every item stored)"
            )
            for name in datasets:
                PARTS[name](args)
        from memory.vector_index import reset_vector_index

        reset_vector_index()


if __name__ == "__main__":
    main()
