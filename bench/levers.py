"""Retrieval levers on LoCoMo and SciFact in one run: ``python bench/levers.py``.

Measures candidate changes to the search before any is built, cheaply: every text (turns,
abstracts, their sentences, the questions) is embedded once with the service's own Embedder
and cached under ``var/levers/`` (delete it to embed again), BM25 vectors come from the same
qdrant-edge Bm25 the service uses, and the rankings are evaluated in numpy, with the hybrid
search re-enacted as the service does it (each mode's top 50 pooled, every pooled item scored
by both, fused by the sum of z-scores; an item sharing no term scores 0 in BM25, IDF as Qdrant
computes it). ``bench/retrieval.py`` then measures what is kept through the service itself.

Each lever is one row of a table per dataset, against the baseline, with the same metrics
bench/retrieval.py prints. A lever is kept only when it helps both datasets (or one, leaving
the other unchanged).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrieval import (  # noqa: E402 - after the path set-up
    LOCOMO_CATEGORIES,
    SCIFACT_DIR,
    _print_table,
    cache_embeddings,
    locomo_conversations,
    locomo_items,
    locomo_questions,
    setup_django,
)

CACHE = ROOT / "var" / "levers"
# Every vector embedded here, by text: bench/retrieval.py --embed-cache reuses it.
EMBED_CACHE = ROOT / "var" / "embeddings.sqlite"
PREFETCH = 50
DIVERSITY_DEPTH = 30  # the session diversity lever re-ranks this many of the top
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def sentences(text: str) -> list[str]:
    """As memory.embeddings.sentences splits an item (at most its first 32)."""
    parts = [part.strip() for part in SENTENCE.split(text) if part.strip()]
    return (parts or [text])[:32]


# Data --------------------------------------------------------------------------------------


@dataclass
class Dataset:
    name: str
    docs: list[str]
    doc_group: list[str]  # the agent each doc belongs to (LoCoMo: conversation)
    doc_session: list[str]  # "" when none
    doc_order: list[int]  # position within its session
    doc_key: list[Any]  # LoCoMo: (session, turn); SciFact: doc id
    queries: list[str]
    query_group: list[str]
    relevant: list[set[Any]]
    query_category: list[int] = field(default_factory=list)


def load_locomo() -> Dataset:
    conversations = locomo_conversations()
    items = locomo_items(conversations)
    order: dict[str, int] = defaultdict(int)
    keys, sessions, positions = [], [], []
    for item in items:
        agent, dia = item["metadata"]["dia_id"].split("/")
        s, t = re.fullmatch(r"D(\d+):(\d+)", dia).groups()  # type: ignore[union-attr]
        keys.append((int(s), int(t)))
        session = f"{agent}/{s}"
        sessions.append(session)
        positions.append(order[session])
        order[session] += 1
    questions = locomo_questions(conversations)
    categories = [
        qa["category"]
        for conv in conversations
        for qa in conv["qa"]
        if qa.get("category") in LOCOMO_CATEGORIES
        and re.findall(r"D(\d+):(\d+)", " ".join(qa.get("evidence", [])))
    ]
    assert len(categories) == len(questions)
    return Dataset(
        "locomo",
        [item["content"] for item in items],
        [item["agent_id"] for item in items],
        sessions,
        positions,
        keys,
        [q for _, q, _ in questions],
        [a for a, _, _ in questions],
        [e for _, _, e in questions],
        categories,
    )


def load_scifact(docs: int | None = None) -> Dataset:
    """SciFact's train queries over its corpus; with `docs`, over the first `docs` abstracts,
    keeping the queries whose relevant abstracts are all among them (as bench/retrieval.py's
    --scifact-docs): fewer distractors, so higher figures, for comparing levers cheaply."""
    with (SCIFACT_DIR / "corpus.jsonl").open() as lines:
        corpus = [json.loads(line) for line in lines][:docs]
    with (SCIFACT_DIR / "queries.jsonl").open() as lines:
        text = {q["_id"]: q["text"] for q in map(json.loads, lines)}
    qrels: dict[str, set[str]] = defaultdict(set)
    with (SCIFACT_DIR / "qrels" / "train.tsv").open() as lines:
        next(lines)
        for line in lines:
            query_id, doc_id, score = line.split("\t")
            if int(score) > 0:
                qrels[query_id].add(doc_id)
    stored = {doc["_id"] for doc in corpus}
    qrels = defaultdict(set, {q: rel for q, rel in qrels.items() if rel <= stored})
    return Dataset(
        "scifact" if docs is None else f"scifact-{len(corpus)}",
        [f"{doc['title']} {doc['text']}".strip() for doc in corpus],
        ["scifact"] * len(corpus),
        [""] * len(corpus),
        [0] * len(corpus),
        [doc["_id"] for doc in corpus],
        [text[q] for q in qrels],
        ["scifact"] * len(qrels),
        list(qrels.values()),
    )


def embedded(ds: Dataset) -> dict[str, np.ndarray]:
    """Doc, query and sentence vectors, from the cache or embedded now."""
    path = CACHE / f"{ds.name}.npz"
    if path.exists():
        return dict(np.load(path))
    from memory.embeddings import get_embedder

    embedder = get_embedder()
    start = time.perf_counter()
    docs = embedder.embed_documents(ds.docs)
    queries = np.stack([embedder.embed_query(q) for q in ds.queries])
    split = [sentences(doc) for doc in ds.docs]
    owner = np.array([i for i, parts in enumerate(split) for _ in parts])
    flat = [part for parts in split for part in parts]
    sent = embedder.embed_documents(flat)
    print(f"  {ds.name}: embedded in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, docs=docs, queries=queries, sentences=sent, owner=owner)
    return {"docs": docs, "queries": queries, "sentences": sent, "owner": owner}


def token_states(ds: Dataset) -> dict[str, np.ndarray]:
    """The model's token states (what its mean pooling averages; [CLS] and [SEP] out, each
    normalised, float16) of every doc and query, flat with offsets, and a mask of the query
    tokens that are content: not punctuation, not a stopword as qdrant's Bm25 drops them (a
    "##" continuation counts as content). Cached beside the vectors."""
    path = CACHE / f"{ds.name}-tokens.npz"
    if path.exists():
        return dict(np.load(path))
    from qdrant_edge import Bm25, Bm25Config

    from memory.embeddings import get_embedder

    embedder = get_embedder()
    embedder.embed_documents(["warm up"])  # loads the model and its tokenizer
    model = embedder._dense.model  # fastembed's ONNX model: onnx_embed gives the token states
    vocab = {i: piece for piece, i in model.tokenizer.get_vocab().items()}
    bm25 = Bm25(Bm25Config())

    @functools.cache  # one Bm25 call per word piece of the vocabulary, not per token
    def is_content(token_id: int) -> bool:
        piece = vocab.get(token_id, "")
        if piece.startswith("##"):
            return True
        return any(c.isalnum() for c in piece) and bool(bm25.embed_query(piece).indices)

    def states(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The texts' token states, flat, with each text's offset and each token's id."""
        flat, offsets, token_ids = [], [0], []
        for start in range(0, len(texts), 32):
            batch = texts[start : start + 32]
            out = model.onnx_embed(batch)
            for row, mask, encoded in zip(
                out.model_output, out.attention_mask, model.tokenize(batch), strict=True
            ):
                keep = mask.astype(bool)
                tokens, ids = row[keep][1:-1], np.array(encoded.ids)[keep][1:-1]
                if not len(tokens):
                    tokens, ids = row[:1], np.array([0])
                flat.append(tokens / np.linalg.norm(tokens, axis=1, keepdims=True))
                token_ids.append(ids)
                offsets.append(offsets[-1] + len(tokens))
        return np.concatenate(flat).astype(np.float16), np.array(offsets), np.concatenate(token_ids)

    start = time.perf_counter()
    docs, doc_offsets, _ = states(ds.docs)
    queries, query_offsets, query_ids = states(ds.queries)
    query_content = np.array([is_content(int(i)) for i in query_ids])
    print(f"  {ds.name}: token states in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    np.savez(
        path,
        docs=docs,
        doc_offsets=doc_offsets,
        queries=queries,
        query_offsets=query_offsets,
        query_content=query_content,
    )
    return dict(np.load(path))


# BM25 and the service's hybrid search, in numpy ------------------------------------------


def bm25_matrix(ds: Dataset, config: Any) -> tuple[Any, Any]:
    """Documents' BM25 term weights as an inverted index (term -> doc indices, weights), IDF
    applied as Qdrant's Modifier.Idf does over the whole collection, and the Bm25 model."""
    from qdrant_edge import Bm25

    model = Bm25(config)
    postings: dict[int, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for i, doc in enumerate(ds.docs):
        vector = model.embed_document(doc)
        for term_id, value in zip(vector.indices, vector.values, strict=True):
            postings[term_id][0].append(i)
            postings[term_id][1].append(value)
    n = len(ds.docs)
    index: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for term, (rows, values) in postings.items():
        idf = math.log((n - len(rows) + 0.5) / (len(rows) + 0.5) + 1.0)
        index[term] = (np.array(rows), np.array(values) * idf)
    return (index, n), model


def bm25_scores(matrix: Any, model: Any, query: str) -> np.ndarray:
    index, n = matrix
    scores = np.zeros(n)
    vector = model.embed_query(query)
    for term, weight in zip(vector.indices, vector.values, strict=True):
        if term in index:
            docs, values = index[term]
            scores[docs] += weight * values
    return scores


def zfuse(
    pool: np.ndarray,
    *scores: np.ndarray,
    weights: Sequence[float] = (),
    norm: str = "z",
    confidence: float = 0.0,
    rrf: int = 0,
) -> np.ndarray:
    """The service's fusion (norm "z": each mode's z-score over the pool, summed); "minmax"
    scales each mode to [0, 1] over the pool instead. With `confidence` p, each mode's
    z-scores are weighted by its top z-score to the power p: a mode whose best candidate stands
    out from the pool counts more for this query. With `rrf` k, reciprocal rank fusion over
    the pool instead (each mode adds 1 / (k + its rank))."""
    fused = np.zeros(len(pool))
    for i, values in enumerate(scores):
        values = values[pool]
        weight = weights[i] if weights else 1.0
        if rrf:
            ranks = np.empty(len(pool))
            ranks[np.argsort(-values, kind="stable")] = np.arange(1, len(pool) + 1)
            fused += weight / (rrf + ranks)
            continue
        if norm == "minmax":
            spread, centre = values.max() - values.min(), values.min()
        else:
            spread, centre = values.std(), values.mean()
        if spread > 0:
            z = (values - centre) / spread
            if confidence:
                weight *= max(float(z.max()), 0.0) ** confidence
            fused += weight * z
    return fused


@dataclass
class Run:
    """Per query, the documents of its agent ranked (indices into ds.docs)."""

    name: str
    ranked: list[np.ndarray]


def evaluate(ds: Dataset, run: Run) -> dict[str, float]:
    out: dict[str, list[float]] = defaultdict(list)
    for q, ranked in enumerate(run.ranked):
        relevant = ds.relevant[q]
        keys = [ds.doc_key[i] for i in ranked[:100]]
        hits = [key in relevant for key in keys]
        if ds.name.startswith("scifact"):
            out["nDCG@10"].append(_ndcg(hits, len(relevant), 10))
            out["R@100"].append(len(relevant & set(keys)) / len(relevant))
            continue
        sessions = {s for s, _ in relevant}
        figures = {
            "turn R@10": float(any(hits[:10])),
            "strict R@10": sum(hits[:10]) / len(relevant),
            "session R@10": float(any(key[0] in sessions for key in keys[:10])),
            "Hit@1": float(hits[0]),
            "nDCG@5": _ndcg(hits, len(relevant), 5),
        }
        for name, value in figures.items():
            out[name].append(value)
            out[f"{name} c{ds.query_category[q]}"].append(value)
    return {name: float(np.mean(values)) for name, values in out.items()}


def _ndcg(hits: Sequence[bool], relevant: int, k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, hit in enumerate(hits[:k]) if hit)
    return dcg / sum(1.0 / math.log2(i + 2) for i in range(min(relevant, k)))


class Bench:
    """One dataset's cached vectors and BM25, and the hybrid search with levers."""

    def __init__(self, ds: Dataset, vectors: dict[str, np.ndarray]) -> None:
        from qdrant_edge import Bm25Config

        self.ds = ds
        self.sparse_cache: dict[tuple[str, int], np.ndarray] = {}
        self.docs, self.queries = vectors["docs"], vectors["queries"]
        self.sent, self.owner = vectors["sentences"], vectors["owner"]
        groups = np.array(ds.doc_group)
        self.members = {g: np.flatnonzero(groups == g) for g in set(ds.doc_group)}
        self.bm25: dict[str, Any] = {"default": bm25_matrix(ds, Bm25Config())}
        # position of each doc's neighbours in its session (-1: none)
        self.prev = np.full(len(ds.docs), -1)
        self.next = np.full(len(ds.docs), -1)
        last: dict[str, int] = {}
        for i, session in enumerate(ds.doc_session):
            if session and session in last:
                self.prev[i], self.next[last[session]] = last[session], i
            if session:
                last[session] = i

    def best_sentence(self, query: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """Each doc's best sentence cosine (its full text when it has one sentence)."""
        scores = np.full(len(self.docs), -1.0)
        np.maximum.at(scores, self.owner, self.sent @ query)
        return scores[docs]

    def run(
        self,
        name: str,
        *,
        mode: str = "hybrid",
        bm25: str = "default",
        dense_weight: float = 1.0,
        sentence: float = 0.0,
        neighbour: float = 0.0,
        session_weight: float = 0.0,
        prf: float = 0.0,
        names_weight: float = 1.0,
        context_top: int = 0,
        session_cap: int = 0,
        bm25_prf: int = 0,
        graph: float = 0.0,
        short_dense: float = 0.0,
        window: float = 0.0,
        variant: str = "",
        spread: int = 0,
        pooled_sentence: float = 0.0,
        depth: int = PREFETCH,
        norm: str = "z",
        session_penalty: float = 0.0,
        confidence: float = 0.0,
        rrf: int = 0,
        sentence_bm25: float = 0.0,
        session_docs: float = 0.0,
        session_pool: float = 0.0,
        expand_sessions: int = 0,
        center: float = 0.0,
        csls: float = 0.0,
        query_view: str = "",
        view_weight: float = 0.0,
        sentence_signal: float = 0.0,
        pool_center: float = 0.0,
        bigram: float = 0.0,
        bigram_signal: float = 0.0,
        dense_temp: float = 0.0,
        sparse_power: float = 0.0,
        context_bm25: float = 0.0,
        context_sides: str = "both",
        sparse_prev: float = 0.0,
        sparse_prev_scope: str = "all",
        context_pool_own: bool = False,
        context_pool_union: bool = False,
        merged: str = "",
        merged_weight: float = 0.3,
        diversity_depth: int = DIVERSITY_DEPTH,
        token_maxsim: float = 0.0,
        token_query: str = "content",
        token_top: int = 0,
        token_idf: float = 0.0,
        token_sentence: float = 0.0,
        fusion: Callable[..., np.ndarray] | None = None,
    ) -> Run:
        matrix, model = self.bm25[bm25]
        ranked = []
        for q, text in enumerate(self.ds.queries):
            docs = self.members[self.ds.query_group[q]]
            query = self.queries[q]
            if view_weight:
                # a second view of the query (its words without the question's function words)
                query = query + view_weight * self.query_views(query_view)[q]
            if center:
                # hubness: the agent's mean item vector taken out of the query, so an item near
                # everything of its agent (a generic turn) scores lower, for dense and sentences
                query = query - center * self.centroid(self.ds.query_group[q])
            dense = self.docs[docs] @ query
            if csls:
                # the same idea as a prior: each item less its mean cosine to its 10 nearest
                dense = dense - csls * self.hub(self.ds.query_group[q])
            if sentence:
                dense = (1 - sentence) * dense + sentence * self.best_sentence(query, docs)
            key = (bm25, q)
            if key not in self.sparse_cache:
                self.sparse_cache[key] = bm25_scores(matrix, model, text)
            sparse = self.sparse_cache[key][docs]
            if window:
                dense = (1 - window) * dense + window * self.best_window(query, docs)
            if merged:
                # one sparse vector per turn: its own BM25 term weights plus merged_weight x
                # those of its previous turn ("prev") or of both texts joined ("joined"), IDF
                # over those vectors (as one named sparse vector in Qdrant would have it)
                sparse = self.merged_bm25(text, merged, merged_weight)[docs]
            own_sparse = sparse
            if context_bm25:
                # document expansion by the conversation: each turn's BM25 document also holds
                # its adjacent turns' words ("previous": the one before, known when it is stored)
                sparse = sparse + context_bm25 * self.context_bm25(text, context_sides)[docs]
            if bigram:
                # sequential dependence, roughly: BM25 over the text's adjacent word pairs
                # (stopwords dropped, words stemmed as Bm25 does) added to the word BM25
                sparse = sparse + bigram * self.bigram_scores(text)[docs]
            if names_weight != 1.0:
                sparse = (
                    sparse + (names_weight - 1.0) * bm25_scores(matrix, model, _names(text))[docs]
                )
            if mode == "dense":
                ranked.append(docs[np.argsort(-dense, kind="stable")])
                continue
            if mode == "sparse":
                order = np.argsort(-sparse, kind="stable")
                ranked.append(docs[order[sparse[order] > 0]])
                continue
            top_dense = np.argsort(-dense, kind="stable")[:depth]
            pooled_by = own_sparse if context_pool_own else sparse
            by_sparse = np.argsort(-pooled_by, kind="stable")[:depth]
            pool = np.unique(np.concatenate([top_dense, by_sparse[pooled_by[by_sparse] > 0]]))
            if context_pool_union:
                # as two named sparse vectors would pool: each one's own top `depth` as well
                for ranked_by in (own_sparse, self.context_bm25(text, context_sides)[docs]):
                    top = np.argsort(-ranked_by, kind="stable")[:depth]
                    pool = np.union1d(pool, top[ranked_by[top] > 0])
            if sparse_prev:
                # BM25 score-level context: a turn's BM25 plus `sparse_prev` x its previous
                # turn's ("all": before pooling; "pool": pool from its own, previous turn's
                # score looked up; "pooled": only when the previous turn is pooled too)
                local = np.full(len(self.ds.docs), -1)
                local[docs] = np.arange(len(docs))
                before = self.prev[docs]
                prev_local = np.where(before >= 0, local[np.maximum(before, 0)], -1)
                gain = np.where(prev_local >= 0, sparse[np.maximum(prev_local, 0)], 0.0)
                if sparse_prev_scope == "all":
                    sparse = sparse + sparse_prev * gain
                    by_sparse = np.argsort(-sparse, kind="stable")[:depth]
                    pool = np.unique(np.concatenate([top_dense, by_sparse[sparse[by_sparse] > 0]]))
                else:
                    if sparse_prev_scope == "pooled":
                        gain = np.where(np.isin(prev_local, pool), gain, 0.0)
                    sparse = sparse + sparse_prev * gain
            weight = dense_weight
            if pool_center:
                # centering on the pool instead of the agent: the pooled items' mean vector
                # taken out of the query (the service holds the pool, not the agent's mean)
                moved = query - pool_center * self.docs[docs[pool]].mean(axis=0)
                dense = self.docs[docs] @ moved
            if short_dense and len(set(model.embed_query(text).indices)) <= 2:
                weight = short_dense
            if pooled_sentence:
                # as the service would score it: the pool comes from the full texts' vectors,
                # then each pooled item's dense score takes in its best sentence
                blend = dense.copy()
                blend[pool] = (1 - pooled_sentence) * dense[pool] + pooled_sentence * (
                    self.best_sentence(query, docs[pool])
                )
                dense = blend
            fuse = partial(zfuse, weights=(weight, 1.0), norm=norm, confidence=confidence, rrf=rrf)
            if dense_temp or sparse_power:
                # the scores' shape before the z-scores: exp(cos / t) stretches the top of the
                # dense scores, BM25 ** p (< 1) compresses the top of the sparse ones
                shaped = np.exp(dense / dense_temp) if dense_temp else dense
                fused = fuse(pool, shaped, sparse**sparse_power if sparse_power else sparse)
            else:
                fused = fuse(pool, dense, sparse)
            if token_maxsim:
                # late interaction: each pooled item's MaxSim over the model's token states (the
                # query's content tokens, or all of them), z-scored as a third signal
                token = np.zeros(len(docs))
                scored = pool
                if token_top:
                    # only the fused pool's top `token_top` are scored; the rest take the
                    # lowest of those scores (they cannot climb past a scored item by it)
                    scored = pool[np.argsort(-fused, kind="stable")[:token_top]]
                token[scored] = self.maxsim(q, docs[scored], token_query, token_idf, token_sentence)
                if token_top:
                    outside = np.setdiff1d(pool, scored)
                    token[outside] = token[scored].min()
                fused = fused + zfuse(pool, token, weights=(token_maxsim,))
            if fusion is not None:
                # a fusion of its own (bench/README's round ten: one learned on the other
                # dataset's labels), given the pool's scores and today's fused ones
                signals = [dense[pool], sparse[pool]]
                if token_maxsim:
                    signals.append(token[pool])
                fused = fusion(q, docs[pool], signals, fused)
            if sentence_signal:
                # the best sentence as a third signal, z-scored on its own (not blended into
                # the whole text's cosine), the whole text's weight lowered by as much
                best = np.zeros(len(docs))
                best[pool] = self.best_sentence(query, docs[pool])
                fused = zfuse(
                    pool, dense, sparse, best, weights=(1 - sentence_signal, 1.0, sentence_signal)
                )
            if bigram_signal:
                fused = fused + zfuse(
                    pool, self.bigram_scores(text)[docs], weights=(bigram_signal,)
                )
            if expand_sessions:
                # every turn of the sessions of the top `expand_sessions` hits joins the pool
                pool = self._expand(docs, pool, fused, expand_sessions)
                fused = fuse(pool, dense, sparse)
            if sentence_bm25:
                # a third signal: each pooled item's best sentence by BM25 (IDF over sentences)
                fused = fused + zfuse(
                    pool, self.sentence_bm25(text, docs), weights=(sentence_bm25,)
                )
            if session_docs:
                fused = fused + session_docs * self._session_scores(q, docs, pool)
            if session_pool:
                fused = fused + session_pool * self._session_pool(docs, pool, fused)
            if bm25_prf:
                # RM3-like: the top 3 fused docs' most weighted terms join the BM25 query
                top = pool[np.argsort(-fused)[:3]]
                extra = " ".join(_top_terms(self.ds.docs[docs[t]], text, bm25_prf) for t in top)
                sparse = sparse + 0.3 * bm25_scores(matrix, model, extra)[docs]
                fused = zfuse(pool, dense, sparse, weights=(weight, 1.0))
            if graph:
                # corpus-graph smoothing: each pooled doc gains `graph` x the mean fused score
                # of its 3 most similar pooled docs (by embedding)
                vecs = self.docs[docs[pool]]
                sim = vecs @ vecs.T
                np.fill_diagonal(sim, -1)
                near = np.argsort(-sim, axis=1)[:, :3]
                fused = fused + graph * (fused[near].mean(axis=1) - fused.min())
            if prf:
                top = pool[np.argsort(-fused)[:3]]
                moved = query + prf * self.docs[docs[top]].mean(axis=0)
                moved /= np.linalg.norm(moved)
                dense2 = self.docs[docs] @ moved
                fused = zfuse(pool, dense2, sparse, weights=(dense_weight, 1.0))
            if context_top:
                # the service: the index hands back the top `context_top` of the fused pool
                keep = np.argsort(-fused, kind="stable")[:context_top]
                pool, fused = pool[keep], fused[keep]
            if neighbour or session_weight:
                fused = self._context(docs, pool, fused, neighbour, session_weight, variant)
            if session_penalty:
                fused = self._penalise_sessions(docs, pool, fused, session_penalty, diversity_depth)
            order = docs[pool[np.argsort(-fused, kind="stable")]]
            if session_cap:
                order = self._cap_sessions(order, session_cap)
            if spread:
                order = self._spread_sessions(order, spread)
            ranked.append(order)
        return Run(name, ranked)

    def maxsim(
        self, q: int, pooled: np.ndarray, which: str, idf: float = 0.0, sentence: float = 0.0
    ) -> np.ndarray:
        """MaxSim of query `q` with each of the `pooled` docs: each query token's best cosine
        among the doc's tokens, summed (`which`: the query's "content" tokens, or "all"); with
        `idf` p, each query token's best cosine weighted by its word piece's IDF ** p over the
        dataset's docs (rare pieces count more, as BM25 weighs its terms); with `sentence` a,
        (1 - a) x that plus a x the best MaxSim of one sentence's tokens (a claim or a question
        matches one sentence: matches strewn over the whole text count less)."""
        if not hasattr(self, "tokens"):
            self.tokens = token_states(self.ds)
        t = self.tokens
        span = slice(t["query_offsets"][q], t["query_offsets"][q + 1])
        query = t["queries"][span].astype(np.float32)
        weights = np.ones(len(query))
        if idf:
            weights = self.piece_idf()[self.query_piece_ids()[q]] ** idf
        if which == "content" and t["query_content"][span].any():
            query, weights = query[t["query_content"][span]], weights[t["query_content"][span]]
        starts, docs = t["doc_offsets"], t["docs"]
        scores = []
        for d in pooled:
            cosines = query @ docs[starts[d] : starts[d + 1]].astype(np.float32).T
            score = float(cosines.max(1) @ weights)
            if sentence:
                owner = self.token_sentences()[d][: cosines.shape[1]]
                best = np.full((int(owner.max()) + 1, len(query)), -1.0)
                np.maximum.at(best, owner, cosines.T)
                score = (1 - sentence) * score + sentence * float((best @ weights).max())
            scores.append(score)
        return np.array(scores)

    @functools.cache  # noqa: B019
    def token_sentences(self) -> list[np.ndarray]:
        """Each doc's word pieces' sentence (as `sentences` splits it), [CLS] and [SEP] out."""
        out = []
        for text, encoded in zip(self.ds.docs, _encoded(self.ds.docs), strict=True):
            keep = np.array(encoded.attention_mask, bool)
            begins = np.array([start for start, _ in encoded.offsets])[keep][1:-1]
            bounds = [m.end() for m in SENTENCE.finditer(text)]
            out.append(np.searchsorted(bounds, begins, side="right"))
        return out

    def _piece_ids(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's word-piece ids as the model reads it ([CLS] and [SEP] out)."""
        return [np.array(e.ids)[np.array(e.attention_mask, bool)][1:-1] for e in _encoded(texts)]

    @functools.cache  # noqa: B019 (one Bench per dataset, kept for the run)
    def query_piece_ids(self) -> list[np.ndarray]:
        return self._piece_ids(self.ds.queries)

    @functools.cache  # noqa: B019
    def piece_idf(self) -> np.ndarray:
        """BM25's IDF of each word piece of the vocabulary over the docs (its document
        frequency among them)."""
        pieces = self._piece_ids(self.ds.docs)
        vocabulary = 1 + max(int(ids.max()) for ids in [*pieces, *self.query_piece_ids()])
        df = np.bincount(np.concatenate([np.unique(ids) for ids in pieces]), minlength=vocabulary)
        n = len(pieces)
        return np.log(1 + (n - df + 0.5) / (df + 0.5))

    def _stems(self, text: str) -> list[int]:
        """The text's words as Bm25 stems them (its term ids), in order, stopwords dropped."""
        _, model = self.bm25["default"]
        if not hasattr(self, "stem_of"):
            self.stem_of: dict[str, list[int]] = {}
        out: list[int] = []
        for word in re.findall(r"\w+", text.lower()):
            if word not in self.stem_of:
                self.stem_of[word] = list(model.embed_query(word).indices)
            out += self.stem_of[word]
        return out

    def bigram_scores(self, text: str, k1: float = 1.2, b: float = 0.75) -> np.ndarray:
        """BM25 (Qdrant's IDF) over adjacent stem pairs, every doc scored."""
        if not hasattr(self, "bigram_index"):
            postings: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
            lengths = np.zeros(len(self.ds.docs))
            for i, doc in enumerate(self.ds.docs):
                stems = self._stems(doc)
                pairs = list(itertools.pairwise(stems))
                lengths[i] = len(pairs)
                for pair in pairs:
                    postings[pair][i] = postings[pair].get(i, 0) + 1
            norm = k1 * (1 - b + b * lengths / max(lengths.mean(), 1e-9))
            n = len(self.ds.docs)
            self.bigram_index = {}
            for pair, tfs in postings.items():
                rows = np.array(list(tfs))
                tf = np.array(list(tfs.values()), dtype=float)
                idf = math.log((n - len(rows) + 0.5) / (len(rows) + 0.5) + 1.0)
                self.bigram_index[pair] = (rows, idf * tf * (k1 + 1) / (tf + norm[rows]))
        scores = np.zeros(len(self.ds.docs))
        stems = self._stems(text)
        for pair in set(itertools.pairwise(stems)):
            if pair in self.bigram_index:
                rows, values = self.bigram_index[pair]
                scores[rows] += values
        return scores

    def merged_bm25(self, text: str, how: str, weight: float) -> np.ndarray:
        if not hasattr(self, "merged_matrices"):
            self.merged_matrices: dict[tuple[str, float], Any] = {}
        key = (how, weight)
        if key not in self.merged_matrices:
            from qdrant_edge import Bm25, Bm25Config

            model = Bm25(Bm25Config())

            def terms(doc: str) -> dict[int, float]:
                vector = model.embed_document(doc)
                return dict(zip(vector.indices, vector.values, strict=True))

            postings: dict[int, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
            for i, doc in enumerate(self.ds.docs):
                vector = terms(doc)
                if self.prev[i] >= 0:
                    before = self.ds.docs[self.prev[i]]
                    extra = terms(before if how == "prev" else f"{doc} {before}")
                    for term, value in extra.items():
                        vector[term] = vector.get(term, 0.0) + weight * value
                for term, value in vector.items():
                    postings[term][0].append(i)
                    postings[term][1].append(value)
            n = len(self.ds.docs)
            index = {}
            for term, (rows, values) in postings.items():
                idf = math.log((n - len(rows) + 0.5) / (len(rows) + 0.5) + 1.0)
                index[term] = (np.array(rows), np.array(values) * idf)
            self.merged_matrices[key] = ((index, n), model)
        matrix, model = self.merged_matrices[key]
        return bm25_scores(matrix, model, text)

    def context_bm25(self, text: str, sides: str) -> np.ndarray:
        if not hasattr(self, "context_matrices"):
            self.context_matrices: dict[str, Any] = {}
        if sides not in self.context_matrices:
            from qdrant_edge import Bm25Config

            docs = []
            for i, doc in enumerate(self.ds.docs):
                around = [self.prev[i]] + ([self.next[i]] if sides == "both" else [])
                docs.append(" ".join([doc] + [self.ds.docs[n] for n in around if n >= 0]))
            flat = Dataset("context", docs, [], [], [], [], [], [], [])
            self.context_matrices[sides] = bm25_matrix(flat, Bm25Config())
        matrix, model = self.context_matrices[sides]
        return bm25_scores(matrix, model, text)

    def centroid(self, group: str) -> np.ndarray:
        if not hasattr(self, "centroids"):
            self.centroids = {g: self.docs[m].mean(axis=0) for g, m in self.members.items()}
        return self.centroids[group]

    def hub(self, group: str) -> np.ndarray:
        """Each of the group's docs' mean cosine to its 10 nearest other docs (CSLS's r_d)."""
        if not hasattr(self, "hubs"):
            self.hubs: dict[str, np.ndarray] = {}
        if group not in self.hubs:
            vecs = self.docs[self.members[group]]
            out = np.empty(len(vecs))
            for start in range(0, len(vecs), 1024):
                sim = vecs[start : start + 1024] @ vecs.T
                sim[np.arange(len(sim)), np.arange(start, start + len(sim))] = -1
                out[start : start + len(sim)] = np.sort(sim, axis=1)[:, -10:].mean(axis=1)
            self.hubs[group] = out
        return self.hubs[group]

    def query_views(self, view: str) -> np.ndarray:
        """The queries rewritten (`view`: "content" drops question and function words),
        embedded once and cached beside the dataset's vectors."""
        if not hasattr(self, "views"):
            self.views: dict[str, np.ndarray] = {}
        if view not in self.views:
            path = CACHE / f"{self.ds.name}-view-{view}.npy"
            if path.exists():
                self.views[view] = np.load(path)
            else:
                from memory.embeddings import get_embedder

                embedder = get_embedder()
                texts = [_content_words(q) or q for q in self.ds.queries]
                self.views[view] = np.stack([embedder.embed_query(t) for t in texts])
                np.save(path, self.views[view])
        return self.views[view]

    def sentence_bm25(self, text: str, docs: np.ndarray) -> np.ndarray:
        """Each doc's best sentence by BM25, the sentences indexed as documents of their own."""
        if not hasattr(self, "sentence_matrix"):
            from qdrant_edge import Bm25Config

            split = [sentences(doc) for doc in self.ds.docs]
            flat = Dataset(
                "sentences", [p for parts in split for p in parts], [], [], [], [], [], [], []
            )
            self.sentence_matrix = bm25_matrix(flat, Bm25Config())
        matrix, model = self.sentence_matrix
        scores = np.zeros(len(self.docs))
        np.maximum.at(scores, self.owner, bm25_scores(matrix, model, text))
        return scores[docs]

    def _sessions(self) -> tuple[np.ndarray, dict[str, int]]:
        """Each doc's session as an index (-1: none) and the sessions' indices by name."""
        if not hasattr(self, "session_of"):
            names = sorted({s for s in self.ds.doc_session if s})
            self.session_index = {name: i for i, name in enumerate(names)}
            self.session_of = np.array([self.session_index.get(s, -1) for s in self.ds.doc_session])
        return self.session_of, self.session_index

    def _session_scores(self, q: int, docs: np.ndarray, pool: np.ndarray) -> np.ndarray:
        """Sessions as documents of their own (the mean of their turns' vectors, their turns'
        text joined for BM25), fused over the agent's sessions by z-score; each pooled turn
        gets its session's score (0 without a session)."""
        session_of, index = self._sessions()
        if not hasattr(self, "session_vectors"):
            from qdrant_edge import Bm25Config

            vectors = np.zeros((len(index), self.docs.shape[1]))
            np.add.at(vectors, session_of[session_of >= 0], self.docs[session_of >= 0])
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
            texts = [""] * len(index)
            for doc, s in enumerate(session_of):
                if s >= 0:
                    texts[s] += " " + self.ds.docs[doc]
            flat = Dataset("sessions", texts, [], [], [], [], [], [], [])
            self.session_vectors = vectors
            self.session_matrix = bm25_matrix(flat, Bm25Config())
        mine = np.unique(session_of[docs][session_of[docs] >= 0])
        out = np.zeros(len(pool))
        if len(mine) < 2:
            return out
        matrix, model = self.session_matrix
        dense = self.session_vectors @ self.queries[q]
        sparse = bm25_scores(matrix, model, self.ds.queries[q])
        fused = np.zeros(len(index))
        fused[mine] = zfuse(mine, dense, sparse)
        owners = session_of[docs[pool]]
        out[owners >= 0] = fused[owners[owners >= 0]]
        return out

    def _session_pool(self, docs: np.ndarray, pool: np.ndarray, fused: np.ndarray) -> np.ndarray:
        """Each pooled turn's session's mean of its 3 best pooled turns, above the pool's floor."""
        session_of, _ = self._sessions()
        owners = session_of[docs[pool]]
        floor = float(fused.min())
        out = np.zeros(len(pool))
        for s in np.unique(owners[owners >= 0]):
            mine = owners == s
            out[mine] = np.sort(fused[mine])[::-1][:3].mean() - floor
        return out

    def _expand(self, docs: np.ndarray, pool: np.ndarray, fused: np.ndarray, n: int) -> np.ndarray:
        """The pool plus every turn of the sessions of its top `n` hits (indices into docs)."""
        session_of, _ = self._sessions()
        top = session_of[docs[pool[np.argsort(-fused, kind="stable")[:n]]]]
        extra = np.flatnonzero(np.isin(session_of[docs], top[top >= 0]))
        return np.union1d(pool, extra)

    def best_window(self, query: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """Each doc's best window of two consecutive sentences (mean of their vectors)."""
        if not hasattr(self, "windows"):
            same = self.owner[1:] == self.owner[:-1]
            pairs = self.sent[1:][same] + self.sent[:-1][same]
            pairs /= np.linalg.norm(pairs, axis=1, keepdims=True)
            self.windows = np.concatenate([self.sent, pairs])
            self.window_owner = np.concatenate([self.owner, self.owner[1:][same]])
        scores = np.full(len(self.docs), -1.0)
        np.maximum.at(scores, self.window_owner, self.windows @ query)
        return scores[docs]

    def _spread_sessions(self, order: np.ndarray, sessions: int) -> np.ndarray:
        """At least `sessions` distinct sessions in the top 10: from the bottom of the top 10 up,
        a hit of an already shown session gives its place to the best hit of a new one."""
        top, rest = list(order[:10]), list(order[10:])
        shown = {self.ds.doc_session[d] for d in top}
        for slot in range(9, -1, -1):
            if len(shown) >= sessions:
                break
            doc = top[slot]
            if sum(self.ds.doc_session[d] == self.ds.doc_session[doc] for d in top) < 2:
                continue
            new = next((d for d in rest if self.ds.doc_session[d] not in shown), None)
            if new is None:
                break
            rest.remove(new)
            top[slot] = new
            rest.insert(0, doc)
            shown = {self.ds.doc_session[d] for d in top}
        return np.array(top + rest, dtype=order.dtype)

    def _penalise_sessions(
        self,
        docs: np.ndarray,
        pool: np.ndarray,
        fused: np.ndarray,
        penalty: float,
        depth: int = DIVERSITY_DEPTH,
    ) -> np.ndarray:
        """Session diversity, MMR-like: the top DIVERSITY_DEPTH re-ranked greedily, each pick's
        score less `penalty` standard deviations of the pool's scores per turn of its session
        already picked; returned as scores that put the picks first in that order."""
        spread = float(fused.std()) or 1.0
        sessions = [self.ds.doc_session[doc] for doc in docs[pool]]
        top = list(np.argsort(-fused, kind="stable")[:depth])
        picked: dict[str, int] = defaultdict(int)
        out = fused.copy()
        ceiling = float(fused.max()) + 1.0
        for rank in range(len(top)):
            best = max(top, key=lambda i: fused[i] - penalty * spread * picked[sessions[i]])
            top.remove(best)
            picked[sessions[best]] += 1
            out[best] = ceiling + depth - rank
        return out

    def _cap_sessions(self, order: np.ndarray, cap: int) -> np.ndarray:
        """At most `cap` items of one session in the top 10; the rest move down."""
        seen: dict[str, int] = defaultdict(int)
        first: list[int] = []
        later: list[int] = []
        for doc in order:
            session = self.ds.doc_session[doc]
            if session and seen[session] >= cap and len(first) < 10:
                later.append(doc)
                continue
            seen[session] += 1
            (first if len(first) < 10 else later).append(doc)
        return np.array(first + later, dtype=order.dtype)

    def _context(
        self,
        docs: np.ndarray,
        pool: np.ndarray,
        fused: np.ndarray,
        neighbour: float,
        session: float,
        variant: str = "",
    ) -> np.ndarray:
        """A pooled item's score plus `neighbour` times its best adjacent turn's score (when in
        the pool) and `session` times its session's best other score in the pool."""
        score = dict(zip(docs[pool].tolist(), fused.tolist(), strict=True))
        floor = float(fused.min())
        out = fused.copy()
        best: dict[str, list[float]] = defaultdict(list)
        for doc, value in score.items():
            best[self.ds.doc_session[doc]].append(value)
        for i, doc in enumerate(docs[pool]):
            if neighbour:
                sides = (
                    (self.prev[doc],) if variant == "previous" else (self.prev[doc], self.next[doc])
                )
                around = [score.get(int(n), floor) for n in sides if n >= 0]
                if variant == "better":  # only a neighbour scoring above the item lifts it
                    around = [value for value in around if value > fused[i]]
                if variant == "sum":  # both neighbours count
                    out[i] += neighbour * sum(value - floor for value in around)
                    continue
                out[i] += neighbour * (max(around) - floor if around else 0.0)
                if variant == "two":  # and the best turn two places away, at half the weight
                    far = [self.prev[self.prev[doc]] if self.prev[doc] >= 0 else -1]
                    far.append(self.next[self.next[doc]] if self.next[doc] >= 0 else -1)
                    values = [score.get(int(n), floor) for n in far if n >= 0]
                    out[i] += neighbour / 2 * (max(values) - floor if values else 0.0)
            if session and self.ds.doc_session[doc]:
                others = sorted(best[self.ds.doc_session[doc]], reverse=True)
                other = others[1] if others[0] == fused[i] and len(others) > 1 else others[0]
                out[i] += session * ((other - floor) if len(others) > 1 else 0.0)
        return out


STOP = {"the", "a", "an", "and", "or", "of", "to", "in", "is", "was", "for", "on", "with", "that"}


QUESTION_WORDS = STOP | {
    "what",
    "when",
    "where",
    "who",
    "whom",
    "which",
    "why",
    "how",
    "did",
    "do",
    "does",
    "is",
    "are",
    "was",
    "were",
    "has",
    "have",
    "had",
    "be",
    "been",
    "would",
    "could",
    "might",
    "by",
    "at",
    "from",
    "as",
    "about",
    "into",
    "her",
    "his",
    "their",
    "they",
    "she",
    "he",
    "it",
    "its",
}


def _encoded(texts: list[str]) -> list[Any]:
    """The texts as the service's model tokenises them (its tokenizer's encodings)."""
    from memory.embeddings import get_embedder

    embedder = get_embedder()
    embedder.embed_documents(["warm up"])  # loads the model and its tokenizer
    return embedder._dense.model.tokenizer.encode_batch(texts)


def _content_words(query: str) -> str:
    """The query without question and function words ("What did Caroline research?" ->
    "Caroline research")."""
    return " ".join(w for w in re.findall(r"[\w'-]+", query) if w.lower() not in QUESTION_WORDS)


def _top_terms(doc: str, query: str, n: int) -> str:
    """The doc's `n` most frequent words of 4+ letters not in the query (RM3's feedback terms,
    roughly)."""
    have = set(re.findall(r"\w+", query.lower()))
    counts: dict[str, int] = defaultdict(int)
    for word in re.findall(r"[a-z]{4,}", doc.lower()):
        if word not in have and word not in STOP:
            counts[word] += 1
    return " ".join(sorted(counts, key=lambda w: -counts[w])[:n])


DATE = re.compile(
    r"\b(19|20)\d\d\b|\b(January|February|March|April|May|June|July|August|September|"
    r"October|November|December)\b"
)
NAME = re.compile(r"(?<!^)(?<![.?!] )\b[A-Z][a-z]+")


def _names(text: str) -> str:
    """Capitalised words not opening the query: the names in it, roughly."""
    return " ".join(NAME.findall(text))


def _bm25_variants() -> dict[str, dict[str, Any]]:
    from qdrant_edge import DisabledStemmer, StopwordsSet, TokenizerType

    return {
        "BM25 avg_len 64": {"avg_len": 64.0},
        "BM25 k1 0.9 b 0.4": {"k": 0.9, "b": 0.4},
        "BM25 k1 1.5": {"k": 1.5},
        "BM25 b 0.5": {"b": 0.5},
        "BM25 b 0.9": {"b": 0.9},
        "BM25 no stemming": {"stemmer": DisabledStemmer()},
        "BM25 no stopwords": {"stopwords": StopwordsSet(custom=set())},
        "BM25 multilingual tokenizer": {"tokenizer": TokenizerType.Multilingual},
        "BM25 tokens >= 2 chars": {"min_token_len": 2},
        "BM25 ascii folding": {"ascii_folding": True},
    }


BM25_VARIANTS = _bm25_variants()


def lever_specs() -> list[tuple[str, dict[str, Any]]]:
    """(name, Bench.run's options) of every lever, the baseline and single modes first."""
    specs: list[tuple[str, dict[str, Any]]] = [
        ("hybrid (baseline)", {}),
        ("dense", {"mode": "dense"}),
        ("sparse", {"mode": "sparse"}),
    ]
    specs += [(f"fusion: dense weight {w}", {"dense_weight": w}) for w in (0.7, 1.3)]
    specs += [(f"sentence vectors: {w} best sentence", {"sentence": w}) for w in (0.3, 0.5)]
    specs += [(f"neighbour turns {w}", {"neighbour": w}) for w in (0.3, 0.5)]
    specs += [
        ("session context 0.2", {"session_weight": 0.2}),
        ("dense PRF 0.5 (top 3)", {"prf": 0.5}),
        ("names x2 in BM25 query", {"names_weight": 2.0}),
    ]
    specs += [(name, {"bm25": name}) for name in BM25_VARIANTS]
    specs += [
        ("neighbour 0.3 + sentence 0.3", {"neighbour": 0.3, "sentence": 0.3}),
        ("neighbour 0.3 + session 0.1", {"neighbour": 0.3, "session_weight": 0.1}),
    ]
    # As the service builds it: the index hands back the top 50 of the fused pool, and an
    # adjacent turn outside them counts as the lowest of those 50.
    service = {"neighbour": 0.3, "context_top": 50}
    specs += [
        (f"neighbour {w}, top 50 (service)", {"neighbour": w, "context_top": 50})
        for w in (0.2, 0.3, 0.4)
    ]
    specs.append(("neighbour 0.3 top 50 + session 0.1", {**service, "session_weight": 0.1}))
    for n in (3, 4, 5):
        specs.append(
            (f"neighbour 0.3 top 50 + at least {n} sessions in top 10", {**service, "spread": n})
        )
    specs.append(("neighbour 0.3 top 50, previous turn only", {**service, "variant": "previous"}))
    specs.append(("neighbour 0.3 top 50, better neighbour only", {**service, "variant": "better"}))
    specs.append(
        (
            "neighbour 0.5 top 50, better neighbour only",
            {**service, "neighbour": 0.5, "variant": "better"},
        )
    )
    for cap in (2, 3):
        specs.append((f"at most {cap} per session in top 10", {"session_cap": cap}))
        specs.append(
            (f"neighbour 0.3 top 50 + at most {cap} per session", {**service, "session_cap": cap})
        )
    specs += [
        ("BM25 PRF (5 terms of top 3, x0.3)", {"bm25_prf": 5}),
        ("corpus graph 0.1 (3 nearest pooled)", {"graph": 0.1}),
        ("corpus graph 0.2 (3 nearest pooled)", {"graph": 0.2}),
        ("short queries (<= 2 terms): dense weight 1.5", {"short_dense": 1.5}),
        ("sentence windows 0.3 (1-2 sentences)", {"window": 0.3}),
        ("neighbour 0.3 top 50 + BM25 k1 0.9 b 0.4", {**service, "bm25": "BM25 k1 0.9 b 0.4"}),
        ("neighbour 0.3 top 50 + sentence 0.3", {**service, "sentence": 0.3}),
    ]
    # Round three: the whole fused pool, sentence vectors as the service would score them,
    # fusion choices and the BM25 variants Qdrant's Bm25 exposes.
    whole = {"neighbour": 0.3}
    specs += [(f"whole pool: neighbour {w}", {"neighbour": w}) for w in (0.2, 0.4)]
    specs += [(f"pooled sentence {w}", {"pooled_sentence": w}) for w in (0.2, 0.3, 0.4, 0.5)]
    specs += [
        (f"whole pool: neighbour 0.3 + pooled sentence {w}", {**whole, "pooled_sentence": w})
        for w in (0.3, 0.5)
    ]
    specs += [
        ("fusion: pool depth 30", {"depth": 30}),
        ("fusion: pool depth 100", {"depth": 100}),
        ("fusion: min-max normalisation", {"norm": "minmax"}),
        ("fusion: dense weight 0.85", {"dense_weight": 0.85}),
        ("fusion: dense weight 1.15", {"dense_weight": 1.15}),
    ]
    specs += [(name, {"bm25": name}) for name in BM25_VARIANTS if name not in dict(specs)]
    specs += [
        ("whole pool: neighbour 0.3, both neighbours summed", {**whole, "variant": "sum"}),
        ("whole pool: neighbour 0.2, both neighbours summed", {"neighbour": 0.2, "variant": "sum"}),
        ("whole pool: neighbour 0.3 + turns 2 away at 0.15", {**whole, "variant": "two"}),
        ("whole pool: neighbour 0.3, pool depth 100", {**whole, "depth": 100}),
        (
            "whole pool: neighbour 0.3 + 2 away at 0.15 + pooled sentence 0.3",
            {**whole, "variant": "two", "pooled_sentence": 0.3},
        ),
        (
            "whole pool: neighbour 0.4 + 2 away at 0.2 + pooled sentence 0.3",
            {"neighbour": 0.4, "variant": "two", "pooled_sentence": 0.3},
        ),
        ("whole pool: neighbour 0.3 + BM25 PRF", {**whole, "bm25_prf": 5}),
        ("whole pool: neighbour 0.3 + dense PRF 0.5", {**whole, "prf": 0.5}),
    ]
    # Round four: session R@10 counts a question when a top-10 turn is from an evidence
    # session; the neighbour context gathers the top 10 into fewer sessions (6.6 -> 5.3 on
    # average). Diversity on the service's ranking (each turn of an already picked session
    # costs `penalty` standard deviations of the pool's scores).
    today = {**whole, "variant": "two", "pooled_sentence": 0.3}
    specs += [
        (f"service + session diversity {p}", {**today, "session_penalty": p})
        for p in (0.05, 0.1, 0.2, 0.3, 0.5)
    ]
    # Round five (2026-12-05): on the service's ranking, fusion that weighs each mode by how
    # far its best candidate stands out, reciprocal rank fusion, sentences by BM25, and the
    # session as a unit (its own document, its pooled turns together, all its turns pooled).
    specs += [
        (f"service + confidence-weighted fusion, power {p}", {**today, "confidence": p})
        for p in (0.5, 1.0)
    ]
    specs += [(f"service with RRF k={k}", {**today, "rrf": k}) for k in (20, 60)]
    specs += [
        (f"service + best sentence by BM25 {w}", {**today, "sentence_bm25": w}) for w in (0.2, 0.4)
    ]
    specs += [
        (f"service + session documents {w}", {**today, "session_docs": w}) for w in (0.3, 0.6)
    ]
    specs += [
        (f"service + session's 3 best pooled turns {w}", {**today, "session_pool": w})
        for w in (0.1, 0.2)
    ]
    specs.append(
        ("service + all turns of the top 3 hits' sessions pooled", {**today, "expand_sessions": 3})
    )
    # Round six (2026-12-06): hubness. MiniLM's vectors of one agent share a common direction,
    # and an item near that mean (a generic turn) ranks high for many queries: the agent's mean
    # vector taken out of the query (centering; the service could keep a sum per agent), or
    # each item's mean cosine to its 10 nearest items as a prior (CSLS). And a second view of
    # the query, its content words alone, added to its vector.
    specs += [(f"service + query centering {a}", {**today, "center": a}) for a in (0.5, 1.0)]
    specs += [(f"service + CSLS prior {b}", {**today, "csls": b}) for b in (0.5, 1.0)]
    specs += [
        (
            f"service + content-words query view {w}",
            {**today, "query_view": "content", "view_weight": w},
        )
        for w in (0.5, 1.0)
    ]
    specs += [
        (
            f"service, best sentence z-scored as a third signal {w}",
            {**whole, "variant": "two", "sentence_signal": w},
        )
        for w in (0.3, 0.5)
    ]
    for prior in ({"center": 0.5}, {"csls": 0.5}):
        specs += [
            (
                f"service + {next(iter(prior))} 0.5 + session diversity {p}",
                {**today, **prior, "session_penalty": p},
            )
            for p in (0.05, 0.1)
        ]
    specs += [(f"service + pool centering {a}", {**today, "pool_center": a}) for a in (0.5, 1.0)]
    specs += [
        (f"service + bigram BM25 in sparse {w}", {**today, "bigram": w}) for w in (0.3, 0.6, 1.0)
    ]
    specs += [
        (f"service + bigram BM25 as a third signal {w}", {**today, "bigram_signal": w})
        for w in (0.2, 0.4)
    ]
    specs += [
        ("service + bigram 0.3 + centering 0.5", {**today, "bigram": 0.3, "center": 0.5}),
        (
            "service + bigram 0.3 + centering 0.5 + content view 0.5",
            {**today, "bigram": 0.3, "center": 0.5, "query_view": "content", "view_weight": 0.5},
        ),
    ]
    specs += [
        (f"service, dense as exp(cos / {t})", {**today, "dense_temp": t}) for t in (0.05, 0.1)
    ]
    specs += [
        (f"service, BM25 ** {p}", {**today, "sparse_power": p}) for p in (0.5, 1.25, 1.5, 2.0, 3.0)
    ]
    specs += [
        (
            f"service, BM25 ** {p} + bigram 0.3 + centering 0.5",
            {**today, "sparse_power": p, "bigram": 0.3, "center": 0.5},
        )
        for p in (1.5, 2.0)
    ]
    specs += [
        (
            f"service + BM25 of the turn with its {sides} turns {x}",
            {**today, "context_bm25": x, "context_sides": sides},
        )
        for sides in ("previous", "both")
        for x in (0.3, 0.6)
    ]
    specs += [
        (
            f"BM25 of the turn with its {sides} turns {x}, no neighbour context",
            {"pooled_sentence": 0.3, "context_bm25": x, "context_sides": sides},
        )
        for sides in ("previous", "both")
        for x in (0.3, 0.6)
    ]
    specs += [
        (
            f"service + BM25 plus {x} x the previous turn's BM25 ({scope})",
            {**today, "sparse_prev": x, "sparse_prev_scope": scope},
        )
        for scope in ("all", "pool", "pooled")
        for x in (0.3, 0.5)
    ]
    specs += [
        (
            f"service + previous turn's words in a second BM25 {x}, pool by the turn's own",
            {**today, "context_bm25": x, "context_sides": "previous", "context_pool_own": True},
        )
        for x in (0.2, 0.3, 0.5)
    ]
    specs += [
        (
            f"service, BM25 vector + {w} x the previous turn's ({how})",
            {**today, "merged": how, "merged_weight": w},
        )
        for how in ("prev", "joined")
        for w in (0.2, 0.3, 0.5)
    ]
    specs += [
        (
            f"service + previous turn's words {x}, pool: each BM25's top 50",
            {
                **today,
                "context_bm25": x,
                "context_sides": "previous",
                "context_pool_own": True,
                "context_pool_union": True,
            },
        )
        for x in (0.3, 0.5)
    ]
    specs += [
        (
            f"service + previous turn's words 0.3 (pool: each BM25's) + session diversity {p}",
            {
                **today,
                "context_bm25": 0.3,
                "context_sides": "previous",
                "context_pool_own": True,
                "context_pool_union": True,
                "session_penalty": p,
            },
        )
        for p in (0.05, 0.1, 0.2)
    ]
    specs += [
        (
            f"service + previous turn's words 0.3 + session diversity {p} over the whole pool",
            {
                **today,
                "context_bm25": 0.3,
                "context_sides": "previous",
                "context_pool_own": True,
                "context_pool_union": True,
                "session_penalty": p,
                "diversity_depth": 1000,
            },
        )
        for p in (0.1, 0.15)
    ]
    # Round eight: today's service (round six's levers; the diversity over the whole pool), then
    # token-level late interaction over the query's content tokens or all of them.
    service_now = {
        **today,
        "context_bm25": 0.3,
        "context_sides": "previous",
        "context_pool_own": True,
        "context_pool_union": True,
        "session_penalty": 0.1,
        "diversity_depth": 1000,
    }
    specs += [("service of 2026-12-07", service_now)]
    specs += [
        (
            f"service + token MaxSim {w} ({which} query tokens), session diversity {p}",
            {**service_now, "token_maxsim": w, "token_query": which, "session_penalty": p},
        )
        for which, w, p in (
            ("all", 1.0, 0.1),
            ("content", 1.0, 0.1),
            ("content", 1.0, 0.2),
            ("content", 1.0, 0.25),
            ("content", 1.5, 0.2),
        )
    ]
    # Round nine: the token MaxSim of the fused pool's top K only (its cost falls with K).
    specs += [
        (
            f"service + token MaxSim {w} of the top {k}, session diversity {p}",
            {
                **service_now,
                "token_maxsim": w,
                "token_query": "content",
                "token_top": k,
                "session_penalty": p,
            },
        )
        for k in (30, 50)
        for w, p in ((1.0, 0.25), (1.25, 0.25))
    ]
    # Round ten: the service of round nine (the token MaxSim at 1.25, diversity 0.25),
    # then the query's tokens weighted by their word pieces' IDF.
    service_tokens = {
        **service_now,
        "token_maxsim": 1.25,
        "token_query": "content",
        "session_penalty": 0.25,
    }
    specs += [("service of round nine", service_tokens)]
    specs += [
        (
            f"service + token IDF ** {p}, token weight {w}",
            {**service_tokens, "token_idf": p, "token_maxsim": w},
        )
        for p in (0.5, 1.0, 2.0)
        for w in (1.25, 2.0)
    ]
    specs += [
        (f"service + best sentence's token MaxSim {a}", {**service_tokens, "token_sentence": a})
        for a in (0.3, 0.6, 1.0)
    ]
    idf = {**service_tokens, "token_idf": 1.0}
    specs += [
        (
            f"service + token IDF, token weight {w}, diversity {p}",
            {**idf, "token_maxsim": w, "session_penalty": p},
        )
        for w, p in ((1.5, 0.25), (2.5, 0.25), (2.0, 0.3), (3.0, 0.3))
    ]
    specs += [
        (
            f"service + token IDF, token weight 2.0, its best sentence {a}",
            {**idf, "token_maxsim": 2.0, "token_sentence": a},
        )
        for a in (0.3, 0.5)
    ]
    # Round eleven: the service now (round ten's IDF weights built in, the token weight 2).
    specs += [("service of round eleven", {**idf, "token_maxsim": 2.0})]
    specs += [(f"query centering {a} alone", {"center": a}) for a in (0.5, 1.0)]
    specs += [(f"dense, query centering {a}", {"mode": "dense", "center": a}) for a in (0.5, 1.0)]
    return specs


def levers(bench: Bench, only: Sequence[str] = ()) -> list[Run]:
    """The levers' runs; with `only`, the first three and those whose name holds one of them."""
    from qdrant_edge import Bm25Config

    runs = []
    for i, (name, options) in enumerate(lever_specs()):
        if only and i >= 3 and not any(part in name for part in only):
            continue
        variant = options.get("bm25", "default")
        if variant not in bench.bm25:
            bench.bm25[variant] = bm25_matrix(bench.ds, Bm25Config(**BM25_VARIANTS[variant]))
        runs.append(bench.run(name, **options))
    return runs


def report(bench: Bench, runs: list[Run]) -> None:
    figures = [(run.name, evaluate(bench.ds, run)) for run in runs]
    names = (
        ["nDCG@10", "R@100"]
        if bench.ds.name.startswith("scifact")
        else ["turn R@10", "strict R@10", "session R@10", "Hit@1", "nDCG@5"]
        + [f"turn R@10 c{c}" for c in LOCOMO_CATEGORIES]
    )
    base = figures[0][1]
    rows = [(name, *(f"{f[m]:.3f} ({f[m] - base[m]:+.3f})" for m in names)) for name, f in figures]
    header = tuple(
        m.replace("c1", "multi-hop")
        .replace("c2", "temporal")
        .replace("c3", "open")
        .replace("c4", "single")
        for m in names
    )
    print(f"\n## {bench.ds.name}: {len(bench.ds.docs):,} docs, {len(bench.ds.queries):,} queries\n")
    _print_table(("lever", *header), rows)
    # Query-side analysis: how many queries BM25 sees as (nearly) empty, and how many name a
    # date or a month; hybrid search already leaves an empty BM25 query to dense alone.
    _, model = bench.bm25["default"]
    terms = [len(set(model.embed_query(q).indices)) for q in bench.ds.queries]
    dated = sum(bool(DATE.search(q)) for q in bench.ds.queries)
    print(
        f"\nqueries with no BM25 term: {terms.count(0)}, with 1-2 terms: "
        f"{sum(1 <= t <= 2 for t in terms)}, naming a date or month: {dated}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--embed-only", action="store_true")
    parser.add_argument("--datasets", default="locomo,scifact")
    parser.add_argument("--only", default="", help="comma-separated parts of lever names")
    parser.add_argument(
        "--scifact-docs", type=int, default=None, help="only the first N abstracts (a subset)"
    )
    args = parser.parse_args()
    only = [part for part in args.only.split(",") if part]
    loaders = {"locomo": load_locomo, "scifact": lambda: load_scifact(args.scifact_docs)}
    with tempfile.TemporaryDirectory(prefix="ferrum-levers-") as data_dir:
        setup_django(data_dir)
        cache_embeddings(EMBED_CACHE)
        for name in args.datasets.split(","):
            ds = loaders[name]()
            vectors = embedded(ds)
            if args.embed_only:
                continue
            start = time.perf_counter()
            bench = Bench(ds, vectors)
            report(bench, levers(bench, only))
            print(f"load average {os.getloadavg()[0]:.1f}")
            print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
