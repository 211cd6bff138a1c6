"""Session consolidation benchmark: ``python bench/consolidation.py [--conversations N]``.

Each LoCoMo session (``/work/shared/data/locomo/locomo10.json``) is replayed as a working-memory
session through the service's own code (sessions.services: start, updates of up to 10 turns,
close; the consolidation runs synchronously, as the worker would run it), each message
``{role: user, name: speaker, content: text, at: session date}`` so a turn line reads
``"[{session date}] {speaker}: {text}"``. Then the LoCoMo questions of categories 1-4 with
evidence search the consolidated items only (hybrid ``memory_search``, the service default),
and session recall@k counts a question when a top-k item comes from an evidence session.

Two baselines on the same data, each as its own agents:
- every turn: each turn stored as an item (MEMORY_NEAR_DUPLICATE=1.01: nothing is merged but
  exact duplicates);
- fallback summary, as the actrone-memory library writes one without an LLM: one item per
  session, the first half and the last quarter of the session's text (its turn lines joined
  by new lines), capped at 800 characters.
Consolidated and fallback items are stored with the service's default MEMORY_NEAR_DUPLICATE
(0.95). Tokens are whitespace-separated words of the stored items' content, after merging (the
unit SESSION_CONSOLIDATION_SHARE budgets; set it in the environment to try another share).
Runs on SQLite and qdrant-edge in a fresh temporary folder; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from retrieval import (  # noqa: E402 - after the path set-up
    LOCOMO_CATEGORIES,
    LOCOMO_FILE,
    _evidence,
    _print_table,
    _verdict,
    cache_embeddings,
    setup_django,
    store_all,
)

KS = (5, 10)
UPDATE_TURNS = 10  # messages appended per PUT-equivalent update
FALLBACK_CHARS = 800
TARGET_RECALL_SHARE = 0.90
TARGET_TOKEN_SHARE = 0.25
SERVICE_NEAR_DUPLICATE = 0.95


def fallback_summary(text: str) -> str:
    """actrone-memory's no-LLM fallback: first half + last quarter, capped at 800 chars."""
    n = len(text)
    if n <= FALLBACK_CHARS:
        return text
    return (text[: n // 2] + "\n...\n" + text[n - n // 4 :])[:FALLBACK_CHARS]


def load(conversations: int | None) -> list[dict[str, Any]]:
    """Per conversation: its sessions [(number, date, turns)] and questions."""
    out = []
    for conv in json.loads(LOCOMO_FILE.read_text())[:conversations]:
        talk = conv["conversation"]
        sessions = []
        for key, turns in talk.items():
            match = re.fullmatch(r"session_(\d+)", key)
            if match and isinstance(turns, list) and turns:
                sessions.append((int(match[1]), talk[f"{key}_date_time"], turns))
        questions = [
            (qa["question"], _evidence(qa.get("evidence", [])))
            for qa in conv["qa"]
            if qa.get("category") in LOCOMO_CATEGORIES
        ]
        out.append(
            {
                "id": conv["sample_id"],
                "sessions": sorted(sessions, key=lambda s: s[0]),
                "questions": [q for q in questions if q[1]],
            }
        )
    return out


def line(when: str, turn: dict[str, Any]) -> str:
    return f"[{when}] {turn['speaker']}: {turn['text']}"


def store_every_turn(data: list[dict[str, Any]]) -> dict[str, int]:
    from django.conf import settings

    settings.MEMORY_NEAR_DUPLICATE = 1.01
    items = [
        {
            "agent_id": f"turns-{conv['id']}",
            "content": line(when, turn),
            "metadata": {"session": f"{conv['id']}/{number}"},
        }
        for conv in data
        for number, when, turns in conv["sessions"]
        for turn in turns
    ]
    report = store_all(items, "session", "every turn")
    return {point: int(ids[0].split("/")[1]) for point, ids in report.ids_of.items()}


def store_fallback(data: list[dict[str, Any]]) -> dict[str, int]:
    from django.conf import settings

    settings.MEMORY_NEAR_DUPLICATE = SERVICE_NEAR_DUPLICATE
    items = [
        {
            "agent_id": f"fallback-{conv['id']}",
            "content": fallback_summary("\n".join(line(when, t) for t in turns)),
            "kind": "session_summary",
            "metadata": {"session": f"{conv['id']}/{number}"},
        }
        for conv in data
        for number, when, turns in conv["sessions"]
    ]
    report = store_all(items, "session", "fallback")
    return {point: int(ids[0].split("/")[1]) for point, ids in report.ids_of.items()}


def consolidate_all(data: list[dict[str, Any]]) -> tuple[dict[str, int], float]:
    """Replay every session and close it; the consolidation runs synchronously. Returns the
    session number of each consolidated item's point id (through its session_id)."""
    from django.conf import settings

    from memory.models import MemoryItem
    from sessions.models import Consolidation
    from sessions.services import (
        session_close,
        session_consolidation_run,
        session_start,
        session_update,
    )

    settings.MEMORY_NEAR_DUPLICATE = SERVICE_NEAR_DUPLICATE
    number_of: dict[str, int] = {}
    start = time.perf_counter()
    done = 0
    total = sum(len(c["sessions"]) for c in data)
    for conv in data:
        agent = f"cons-{conv['id']}"
        for number, when, turns in conv["sessions"]:
            session, state = session_start(agent_id=agent, fields={})
            number_of[str(session.pk)] = number
            messages = [
                {"role": "user", "name": t["speaker"], "content": t["text"], "at": when}
                for t in turns
            ]
            for offset in range(0, len(messages), UPDATE_TURNS):
                state = session_update(
                    session_id=session.pk,
                    version=state["version"],
                    fields={},
                    append_messages=messages[offset : offset + UPDATE_TURNS],
                )
            consolidation = session_close(session_id=session.pk)
            consolidation = session_consolidation_run(consolidation_id=consolidation.pk)
            assert consolidation.status == Consolidation.Status.DONE
            done += 1
            if done % 20 == 0 or done == total:
                rate = done / (time.perf_counter() - start)
                print(f"  consolidated {done}/{total} sessions ({rate:.2f}/s)", file=sys.stderr)
    seconds = time.perf_counter() - start
    items = MemoryItem.objects.filter(agent_id__startswith="cons-")
    return {str(pk): number_of[sid] for pk, sid in items.values_list("id", "session_id")}, seconds


def recall(data: list[dict[str, Any]], prefix: str, session_of: dict[str, int]) -> dict[int, float]:
    from memory.selectors import memory_search

    hits = dict.fromkeys(KS, 0)
    n = 0
    for conv in data:
        for question, evidence in conv["questions"]:
            sessions = {s for s, _ in evidence}
            found = memory_search(query=question, agent_id=f"{prefix}-{conv['id']}", limit=max(KS))
            ranked = [session_of[str(hit.item.id)] for hit in found]
            for k in KS:
                hits[k] += any(s in sessions for s in ranked[:k])
            n += 1
    return {k: hits[k] / n for k in KS}


def tokens(prefix: str) -> tuple[int, int]:
    from memory.models import MemoryItem

    contents = MemoryItem.objects.filter(agent_id__startswith=f"{prefix}-").values_list(
        "content", flat=True
    )
    return len(contents), sum(len(c.split()) for c in contents)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=None, help="only the first N")
    parser.add_argument(
        "--embed-cache",
        type=Path,
        default=None,
        help="an SQLite file of dense vectors to reuse and fill (as bench/retrieval.py's)",
    )
    args = parser.parse_args(argv)
    data = load(args.conversations)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-consolidation-") as data_dir:
        setup_django(data_dir)
        if args.embed_cache:
            cache_embeddings(args.embed_cache)
        from django.conf import settings

        from ferrum_memory.celery import app

        app.conf.task_always_eager = False  # close sends nothing anywhere: run below instead
        app.conf.broker_url = "memory://"
        sessions = sum(len(c["sessions"]) for c in data)
        questions = sum(len(c["questions"]) for c in data)
        print(
            f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
            f"model {settings.FASTEMBED_MODEL}, {settings.FASTEMBED_THREADS} embedding "
            f"thread(s); SQLite + qdrant-edge in a temporary folder; {len(data)} conversations, "
            f"{sessions} sessions, {questions} questions (categories 1-4 with evidence); "
            f"hybrid search; SESSION_CONSOLIDATION_SHARE {settings.SESSION_CONSOLIDATION_SHARE}"
        )
        t0 = time.perf_counter()
        turns_of = store_every_turn(data)
        turn_seconds = time.perf_counter() - t0
        consolidated_of, cons_seconds = consolidate_all(data)
        fallback_of = store_fallback(data)
        results = {
            "every turn": (recall(data, "turns", turns_of), tokens("turns"), turn_seconds),
            "fallback summary (actrone-memory)": (
                recall(data, "fallback", fallback_of),
                tokens("fallback"),
                None,
            ),
            "consolidated (this service)": (
                recall(data, "cons", consolidated_of),
                tokens("cons"),
                cons_seconds,
            ),
        }
        base_recall, (_, base_tokens), _ = results["every turn"]
        rows = []
        for name, (r, (items, toks), seconds) in results.items():
            rows.append(
                (
                    name,
                    f"{items:,}",
                    f"{toks:,}",
                    f"{toks / base_tokens:.1%}",
                    *(f"{r[k]:.3f}" for k in KS),
                    f"{r[10] / base_recall[10]:.1%}",
                    f"{seconds:.0f}" if seconds is not None else "",
                )
            )
        print()
        _print_table(
            (
                "items",
                "stored",
                "tokens",
                "tokens vs turns",
                *(f"session R@{k}" for k in KS),
                "R@10 vs turns",
                "seconds",
            ),
            rows,
        )
        cons_recall, (_, cons_tokens), _ = results["consolidated (this service)"]
        share, token_share = cons_recall[10] / base_recall[10], cons_tokens / base_tokens
        print()
        _print_table(
            ("check", "figure", "target", "met"),
            [
                (
                    "consolidated session R@10 / every-turn session R@10",
                    f"{share:.1%}",
                    f">= {TARGET_RECALL_SHARE:.0%}",
                    _verdict(share >= TARGET_RECALL_SHARE),
                ),
                (
                    "consolidated tokens / every-turn tokens",
                    f"{token_share:.1%}",
                    f"<= {TARGET_TOKEN_SHARE:.0%}",
                    _verdict(token_share <= TARGET_TOKEN_SHARE),
                ),
            ],
        )
        print(
            "\nsession R@k: share of questions with a top-k item from an evidence turn's "
            "session. Tokens: whitespace-separated words of the stored content. seconds: "
            "storing every turn; replaying and consolidating every session (embedding each "
            "sentence once for the extraction, then the items)."
        )
        from memory.vector_index import reset_vector_index

        reset_vector_index()


if __name__ == "__main__":
    main()
