"""Memory search and store benchmark: ``python bench/search.py [--part latency store]``.

Runs the service's own code (``memory.selectors.memory_search``,
``memory.services.memory_store_many``) on the embedded engines: SQLite and a qdrant-edge shard
in a fresh temporary data folder. Each part is one function that prints one table.

- ``latency``: hybrid search p50/p95 at N = 10^4 and 10^5 items (``--sizes``), (a) all of one
  agent and (b) spread over 100 agents. Embedding 10^5 texts through the model would take most
  of an hour here, so the rows are written straight to the DB: real short texts (LoCoMo turns,
  each with a numbered suffix to make it unique) with random unit vectors as their embedding
  (and one per sentence, as sentence vectors, for a text of two or more, and random int8 token
  vectors, one per word piece of the text as the model's tokenizer cuts it),
  all in one transaction under one "memory" revision, exactly as ``memory_store_many`` would
  leave them. The vector index is then rebuilt from the DB (timed: reading the rows, BM25 of
  each text, upserting into qdrant-edge). Queries are real questions (LoCoMo), embedded per
  query: each timing is the whole ``memory_search`` call, query embedding and DB fetch included.
- ``store``: ``memory_store_many`` throughput in items/s, one item per call and in batches of
  256, with real embeddings (the configured model) of distinct LoCoMo turns, on top of the
  last index the latency part built (or an empty one when it did not run). Near-duplicate
  merging stays on (the default MEMORY_NEAR_DUPLICATE), as in service.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

# Run as a plain script from anywhere: make the project importable.
ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from retrieval import SCIFACT_DIR, setup_django  # noqa: E402 - after the path set-up

LOCOMO_FILE = ROOT.parent / "shared" / "data" / "locomo" / "locomo10.json"
TARGET_P95_MS = 20.0  # at 10^5 items
TARGET_AT = 10**5
SPREAD_AGENTS = 100
INSERT_CHUNK = 2_000
STORE_BATCH = 256  # the API's MAX_BATCH
SCIFACT_EMBEDDED = 64  # abstracts embedded alone, after the LoCoMo turns


def locomo_texts() -> tuple[list[str], list[str]]:
    """(every LoCoMo turn as "speaker: text", every question), in file order."""
    conversations = json.loads(LOCOMO_FILE.read_text())
    turns = [
        f"{turn['speaker']}: {turn['text']}"
        for conv in conversations
        for key, session in conv["conversation"].items()
        if key.startswith("session_") and isinstance(session, list)
        for turn in session
    ]
    questions = [qa["question"] for conv in conversations for qa in conv["qa"]]
    return turns, questions


def scifact_abstracts(count: int) -> list[str]:
    """The first `count` SciFact abstracts."""
    with (SCIFACT_DIR / "corpus.jsonl").open() as lines:
        return [json.loads(line)["text"] for line in itertools.islice(lines, count)]


def percentiles(times_ms: Sequence[float]) -> tuple[float, float]:
    return statistics.median(times_ms), statistics.quantiles(times_ms, n=20)[18]


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """A Markdown table with padded columns, readable as text too."""
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


# latency -----------------------------------------------------------------------------------


def load_items(n: int, agents: list[str], turns: list[str], seed: int) -> float:
    """Replace every memory item with `n` synthetic ones spread round-robin over `agents`;
    return the seconds it took. One transaction, one revision, as a service write would."""
    from django.conf import settings
    from django.db import transaction
    from django.utils import timezone

    from ferrum_memory.core.revisions import revision_take
    from memory.embeddings import get_embedder, sentences
    from memory.models import MemoryItem
    from memory.services import content_hash

    rng = np.random.default_rng(seed)
    embedder = get_embedder()
    embedder.embed_documents(["load the model and its tokenizer"])
    tokenizer = embedder._dense.model.tokenizer
    start = time.perf_counter()
    MemoryItem.objects.all().delete()  # one DELETE (no relations); no tombstones: rebuilt next
    now = timezone.now()
    with transaction.atomic():
        revision = revision_take(name="memory")
        for offset in range(0, n, INSERT_CHUNK):
            size = min(INSERT_CHUNK, n - offset)
            vectors = rng.standard_normal((size, 384)).astype("<f4")
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            rows = []
            contents = [f"{turns[(offset + j) % len(turns)]} (#{offset + j})" for j in range(size)]
            # Word pieces less [CLS] and [SEP]; the tokenizer pads a batch to its longest text.
            encodings = tokenizer.encode_batch(contents)
            token_counts = [sum(e.attention_mask) - 2 for e in encodings]
            for j in range(size):
                i = offset + j
                content = contents[j]
                # as stored: a vector per sentence when there are two or more (random too)
                count = len(sentences(content))
                parts = rng.standard_normal((count if count > 1 else 0, 384)).astype("<f4")
                parts /= np.linalg.norm(parts, axis=1, keepdims=True)
                rows.append(
                    MemoryItem(
                        agent_id=agents[i % len(agents)],
                        content=content,
                        content_hash=content_hash(content),
                        created_at=now,
                        embedding=vectors[j].tobytes(),
                        sentence_embeddings=parts.tobytes(),
                        token_embeddings=rng.integers(
                            -127, 128, (token_counts[j], 384), dtype=np.int8
                        ).tobytes(),
                        embedding_model=settings.FASTEMBED_MODEL,
                        revision=revision,
                    )
                )
            MemoryItem.objects.bulk_create(rows)
    return time.perf_counter() - start


def build_index() -> float:
    """Drop this process's index and rebuild it from the DB; return the seconds it took."""
    from memory.embeddings import get_embedder
    from memory.vector_index import get_vector_index

    index = get_vector_index()
    start = time.perf_counter()
    index.engine.reset(get_embedder().dim)  # forgets its cursor: the catch-up rebuilds
    index.catch_up()
    return time.perf_counter() - start


def count_word_pieces() -> float:
    """Seconds the beat's count of the items' word pieces takes (memory_count_word_pieces)."""
    from memory.services import memory_count_word_pieces

    start = time.perf_counter()
    memory_count_word_pieces()
    return time.perf_counter() - start


def time_searches(
    questions: list[str], agents: list[str], repeats: int, warmup: int
) -> tuple[list[float], int]:
    """Wall time in ms of each hybrid memory_search (limit 10), round-robin over agents and
    questions; and the fewest hits a search returned (a check that the index was searched)."""
    from memory.selectors import memory_search

    times, fewest = [], 10
    for i in range(warmup + repeats):
        question, agent = questions[i % len(questions)], agents[i % len(agents)]
        start = time.perf_counter_ns()
        hits = memory_search(query=question, agent_id=agent, limit=10, mode="hybrid")
        elapsed = (time.perf_counter_ns() - start) / 1e6
        if i >= warmup:
            times.append(elapsed)
            fewest = min(fewest, len(hits))
    return times, fewest


def time_index(
    questions: list[str], agents: list[str], repeats: int, mode: str = "hybrid", tokens: bool = True
) -> list[float]:
    """Wall time in ms of the vector index's search alone (catch-up check included), with the
    queries embedded beforehand: the part of a search the index engine costs; hybrid without
    `tokens` leaves the late interaction out."""
    from django.utils import timezone

    from memory.embeddings import get_embedder
    from memory.selectors import weighted_query_tokens
    from memory.vector_index import SearchFilter, get_vector_index

    embedder, index = get_embedder(), get_vector_index()
    queries = []
    for question in questions:
        embedded = embedder.embed_query_tokens(question)
        weighted = weighted_query_tokens(embedded)
        tokens_of = weighted.tolist() if tokens and mode == "hybrid" else []
        queries.append((embedded.vector.tolist(), embedder.sparse_query(question), tokens_of))
    times = []
    for i in range(repeats):
        (dense, sparse, query_tokens), agent = queries[i % len(queries)], agents[i % len(agents)]
        flt = SearchFilter(agent_id=agent, now=timezone.now().timestamp())
        start = time.perf_counter_ns()
        index.search(mode=mode, dense=dense, sparse=sparse, tokens=query_tokens, flt=flt, limit=10)
        times.append((time.perf_counter_ns() - start) / 1e6)
    return times


def part_latency(args: argparse.Namespace) -> None:
    from memory.embeddings import get_embedder

    turns, questions = locomo_texts()
    questions = questions[:: max(1, len(questions) // (args.repeats + args.warmup))]
    embedder = get_embedder()
    embed_times = []
    for question in questions[: args.repeats]:
        start = time.perf_counter_ns()
        embedder.embed_query(question)
        embed_times.append((time.perf_counter_ns() - start) / 1e6)
    embed_p50, embed_p95 = percentiles(embed_times)

    rows: list[tuple[str, ...]] = []
    layouts = [
        ("1 agent", ["solo"]),
        (f"{SPREAD_AGENTS} agents", [f"agent-{a:03d}" for a in range(SPREAD_AGENTS)]),
    ]
    for n in args.sizes:
        for label, agents in layouts:
            print(f"  latency: {n:,} items, {label}: loading", file=sys.stderr, flush=True)
            load_s = load_items(n, agents, turns, args.seed)
            build_s = build_index()
            count_s = count_word_pieces()
            times, fewest = time_searches(questions, agents, args.repeats, args.warmup)
            p50, p95 = percentiles(times)
            index_p50, index_p95 = percentiles(time_index(questions, agents, args.repeats))
            untokened_p50, _ = percentiles(
                time_index(questions, agents, args.repeats, tokens=False)
            )
            single_p50 = [
                percentiles(time_index(questions, agents, args.repeats, mode))[0]
                for mode in ("dense", "sparse")
            ]
            target = f"p95 <= {TARGET_P95_MS:.0f} ms" if n == TARGET_AT else ""
            met = ("yes" if p95 <= TARGET_P95_MS else "**NO**") if target else ""
            rows.append(
                (
                    f"{n:,}",
                    label,
                    f"{n // len(agents):,}",
                    f"{load_s:.1f}",
                    f"{build_s:.1f}",
                    f"{count_s:.1f}",
                    f"{p50:.1f}",
                    f"{p95:.1f}",
                    f"{index_p50:.1f} / {index_p95:.1f}",
                    f"{untokened_p50:.1f}",
                    " / ".join(f"{ms:.1f}" for ms in single_p50),
                    str(fewest),
                    target,
                    met,
                )
            )
    print(
        f"\n## latency: hybrid memory_search (limit 10) over qdrant-edge + SQLite, "
        f"{args.repeats} sequential searches after {args.warmup} unmeasured, query embedding "
        "included\n"
    )
    _print_table(
        (
            "items",
            "layout",
            "items/agent",
            "DB load s",
            "index build s",
            "word piece count s",
            "p50 ms",
            "p95 ms",
            "index alone p50 / p95 ms",
            "index alone, no tokens, p50 ms",
            "dense / BM25 alone p50 ms",
            "min hits",
            "target",
            "met",
        ),
        rows,
    )
    print(
        f"\nquery embedding alone ({embedder.model_name}, "
        f"{os.environ.get('FASTEMBED_THREADS', '1')} thread(s)): p50 {embed_p50:.1f} ms, "
        f"p95 {embed_p95:.1f} ms of each search above.\nRows: random unit vectors with real "
        "LoCoMo texts, written straight to the DB; index build = rebuild from the DB (BM25 of "
        "every text + upsert + building the per-agent HNSW graphs), as after `memory_reindex` or a "
        "lost shard; word piece count = the beat's count of the items' word pieces (their IDF "
        "weighs the query's tokens); index alone = the vector index's search with the query "
        "embedded beforehand "
        "(hybrid: one query for the pool of each mode's top 50 with dense scores, one for their "
        "BM25, best sentence and token MaxSim scores, and the fusion), beside the same without "
        "the token MaxSim (the query's tokens not sent) and each single mode's."
    )


# store -------------------------------------------------------------------------------------


def part_store(args: argparse.Namespace) -> None:
    from memory.models import MemoryItem
    from memory.services import memory_store_many

    turns, _ = locomo_texts()
    unique = list(dict.fromkeys(turns))
    single = [{"agent_id": "store-one", "content": t} for t in unique[: args.store_single]]
    rest = unique[args.store_single : args.store_single + args.store_batched]
    batched = [{"agent_id": "store-batch", "content": t} for t in rest]
    in_index = MemoryItem.objects.count()
    memory_store_many(items=[{"agent_id": "store-warmup", "content": "warm up the model"}])

    rows = []
    for label, items, size in (
        ("one item per call", single, 1),
        (f"batches of {STORE_BATCH}", batched, STORE_BATCH),
    ):
        merged = 0
        start = time.perf_counter()
        for offset in range(0, len(items), size):
            results = memory_store_many(items=items[offset : offset + size])
            merged += sum(bool(r.duplicate) for r in results)
        elapsed = time.perf_counter() - start
        rows.append(
            (
                label,
                f"{len(items):,}",
                f"{len(items) / elapsed:.1f}",
                f"{elapsed / len(items) * 1e3:.0f}",
                str(merged),
            )
        )
        print(f"  store: {label} done", file=sys.stderr, flush=True)
    print(
        f"\n## store: memory_store_many with real embeddings, on an index already holding "
        f"{in_index:,} items; each call embeds, checks duplicates, commits and indexes\n"
    )
    _print_table(("store", "items", "items/s", "ms/item", "merged as duplicates"), rows)
    print_embedding_order([item["content"] for item in batched], "LoCoMo turns (the batched above)")
    # Long texts too: SciFact abstracts, most past the model's 256 tokens.
    print_embedding_order(scifact_abstracts(SCIFACT_EMBEDDED), "SciFact abstracts")


def print_embedding_order(texts: list[str], what: str) -> None:
    """Embedding alone, `texts` in batches of STORE_BATCH: embed_documents (texts of like
    length, batches of about BATCH_TOKENS padded tokens) beside the model fed DOCUMENT_BATCH
    texts at a time, by length (as embed_documents did until 2026-12) and in the order given
    (before that); best of three rounds."""
    from memory.embeddings import DOCUMENT_BATCH, get_embedder

    embedder = get_embedder()
    ways: dict[str, Callable[[list[str]], object]] = {
        "embed_documents (by length, token budget)": embedder.embed_documents,
        f"by length, {DOCUMENT_BATCH} at a time": lambda batch: list(
            embedder._dense.embed(sorted(batch, key=len), batch_size=DOCUMENT_BATCH)
        ),
        f"in the order given, {DOCUMENT_BATCH} at a time": lambda batch: list(
            embedder._dense.embed(batch, batch_size=DOCUMENT_BATCH)
        ),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(3):
        for way, embed in ways.items():
            start = time.perf_counter()
            for offset in range(0, len(texts), STORE_BATCH):
                embed(texts[offset : offset + STORE_BATCH])
            best[way] = min(best[way], time.perf_counter() - start)
    print(f"\nembedding alone, {len(texts):,} {what}, in calls of up to {STORE_BATCH}:")
    for way, seconds in best.items():
        print(f"- {way}: {len(texts) / seconds:.1f} texts/s")


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {
    "latency": part_latency,
    "store": part_store,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--part", nargs="+", choices=list(PARTS), default=["latency", "store"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10**4, 10**5])
    parser.add_argument("--repeats", type=int, default=200, help="timed searches per row")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store-single", type=int, default=100, help="items stored one by one")
    parser.add_argument("--store-batched", type=int, default=1024, help="items stored in batches")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-search-") as data_dir:
        setup_django(data_dir, keep_near_duplicates=False)
        print(
            f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        for part in args.part:
            PARTS[part](args)
        from memory.vector_index import reset_vector_index

        reset_vector_index()
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
