import json
import os
import subprocess
import sys
from functools import partial
from typing import Any

import numpy as np
import pytest

from memory import vector_index
from memory.models import MemoryItem
from memory.services import memory_delete_many, memory_store_many, reset_model_check
from memory.vector_index import EdgeEngine, ServerEngine, VectorIndex, get_vector_index
from tests.concurrency import run_together


def query_args(query: str, agent: str = "a") -> dict[str, Any]:
    """An index search's query: `query` embedded both ways, filtered to `agent`."""
    from memory.embeddings import get_embedder
    from memory.vector_index import SearchFilter

    embedder = get_embedder()
    return {
        "dense": embedder.embed_query(query).tolist(),
        "sparse": embedder.sparse_query(query),
        "flt": SearchFilter(agent_id=agent, now=0.0),
    }


def indexed_ids(index: VectorIndex, agent: str, query: str = "memory") -> set[str]:
    from memory.embeddings import get_embedder
    from memory.vector_index import SearchFilter

    hits = index.search(
        mode="sparse",
        dense=[],
        sparse=get_embedder().sparse_query(query),
        flt=SearchFilter(agent_id=agent, now=0.0),
        limit=100,
    )
    return {str(pk) for pk, _ in hits}


def db_ids(agent: str) -> set[str]:
    return {
        str(pk) for pk in MemoryItem.objects.filter(agent_id=agent).values_list("id", flat=True)
    }


@pytest.mark.django_db
def test_store_with_the_index_down_returns_201_and_is_indexed_later(api_client, settings, tmp_path):
    from qdrant_client import QdrantClient

    settings.DATA_DIR = tmp_path
    # Port 1 on loopback: nothing listens, the server is "down". Patched in because no Qdrant
    # server binary installs here; the engine code is the real one.
    down = VectorIndex(ServerEngine(QdrantClient(url="http://127.0.0.1:1", timeout=1), "c"))
    vector_index._index = down
    try:
        response = api_client.post(
            "/memory/store", {"agent_id": "a", "content": "memory of the outage"}, format="json"
        )
        assert response.status_code == 201 and response.json()["indexed"] is False
        assert api_client.get("/health").status_code == 503
        # The server comes back (the in-process engine stands in for it): the next catch-up,
        # as the beat task or any search does it, indexes the stored item.
        vector_index._index = VectorIndex(ServerEngine(QdrantClient(location=":memory:"), "c"))
        from memory.tasks import index_catch_up

        assert index_catch_up() is True
        assert indexed_ids(get_vector_index(), "a") == db_ids("a") != set()
    finally:
        vector_index.reset_vector_index()


@pytest.mark.django_db
def test_a_servers_upserts_are_cut_into_requests_it_accepts(settings, tmp_path, monkeypatch):
    """A Qdrant server refuses requests over 32 MB; a catch-up's 256 points with their token
    vectors can reach hundreds. Each request carries at most REQUEST_NUMBERS components."""
    from qdrant_client import QdrantClient

    from memory.services import memory_store_many

    settings.DATA_DIR = tmp_path
    settings.MEMORY_NEAR_DUPLICATE = 1.01  # alike on purpose: keep every one
    client = QdrantClient(location=":memory:")
    requests: list[int] = []
    upsert = client.upsert

    def counted(collection, *, points, **kwargs):  # observes, then the real upsert
        # Dense vectors and multivectors (sentences, tokens) are lists; BM25's are not.
        listed = [v for p in points for v in p.vector.values() if isinstance(v, list)]
        requests.append(int(sum(np.size(v) for v in listed)))
        return upsert(collection, points=points, **kwargs)

    monkeypatch.setattr(client, "upsert", counted)
    monkeypatch.setattr(vector_index, "REQUEST_NUMBERS", 40 * 384)
    vector_index._index = VectorIndex(ServerEngine(client, "c"))
    try:
        texts = [f"memory number {i}: the ferry left the harbour at dawn" for i in range(12)]
        memory_store_many(items=[{"agent_id": "a", "content": text} for text in texts])
        get_vector_index().rebuild()
        assert indexed_ids(get_vector_index(), "a") == db_ids("a") and len(db_ids("a")) == 12
        # About 15 word pieces and a vector each: two or three points a request, not 12.
        assert len(requests) > 2 and max(requests) <= 40 * 384
    finally:
        vector_index.reset_vector_index()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("vector_engine")
def test_concurrent_writers_never_lose_a_committed_write(settings):
    settings.MEMORY_NEAR_DUPLICATE = 1.01  # the texts are alike on purpose: keep every one
    index = get_vector_index()

    def writer(number: int) -> None:
        for step in range(6):
            stored = memory_store_many(
                items=[{"agent_id": "a", "content": f"memory {number} {step} {'x' * step}"}]
            )
            if step % 3 == 2:
                memory_delete_many(queryset=MemoryItem.objects.filter(pk=stored[0].item.pk))

    run_together([partial(writer, n) for n in range(3)], until_done=index.catch_up)
    index.catch_up()
    assert indexed_ids(index, "a") == db_ids("a")
    assert len(db_ids("a")) == 12


@pytest.mark.django_db
def test_an_edge_shard_survives_a_restart_and_two_processes_never_share_one(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    memory_store_many(items=[{"agent_id": "a", "content": "first memory"}])
    first = VectorIndex(EdgeEngine(tmp_path / "edge"))
    first.catch_up()
    second = VectorIndex(EdgeEngine(tmp_path / "edge"))  # as another process would
    assert first.engine._path != second.engine._path  # type: ignore[attr-defined]
    cursor = first.cursor
    first.close()
    memory_store_many(items=[{"agent_id": "a", "content": "second memory"}])
    again = VectorIndex(EdgeEngine(tmp_path / "edge"))  # the restarted first process
    assert again.engine._path == first.engine._path and again.cursor == cursor  # type: ignore[attr-defined]
    again.catch_up()
    assert indexed_ids(again, "a") == db_ids("a")
    again.close()
    second.close()


@pytest.mark.django_db
def test_an_edge_shard_flushes_stores_when_due_and_deletions_at_once(
    settings, tmp_path, monkeypatch
):
    """A catch-up's upserts reach the disk at most every EDGE_FLUSH_SECONDS (a flush per store
    cost each one 17 ms), the cursor on disk never ahead of them; a deletion is flushed with
    its catch-up, the rest when due or at close. A process killed before its flush comes back
    at the older cursor and applies the newer items again."""
    import shutil

    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(vector_index, "EDGE_FLUSH_SECONDS", 3600.0)

    def store(content: str) -> None:
        memory_store_many(items=[{"agent_id": "a", "content": content}])
        index.catch_up()

    index = VectorIndex(EdgeEngine(tmp_path / "edge"))
    path = index.engine._path  # type: ignore[attr-defined]

    def on_disk() -> int:
        return json.loads((path / "state.json").read_text())["cursor"]

    store("first memory")  # a build: flushed
    built = index.cursor
    assert on_disk() == built
    store("second memory")
    assert index.cursor > built and on_disk() == built

    killed = tmp_path / "killed"  # what a SIGKILL now would leave on disk
    shutil.copytree(path, killed / "shard-0", ignore=shutil.ignore_patterns("lock"))
    again = VectorIndex(EdgeEngine(killed))
    assert again.cursor == built  # loaded as it was, not rebuilt
    again.catch_up()
    assert indexed_ids(again, "a") == db_ids("a") and len(db_ids("a")) == 2
    again.close()

    memory_delete_many(queryset=MemoryItem.objects.filter(content="first memory"))
    index.catch_up()
    assert on_disk() == index.cursor
    store("third memory")
    assert on_disk() < index.cursor
    monkeypatch.setattr(vector_index, "EDGE_FLUSH_SECONDS", 0.0)
    index.save_if_due()  # as an index server's idle poll does
    assert on_disk() == index.cursor
    monkeypatch.setattr(vector_index, "EDGE_FLUSH_SECONDS", 3600.0)
    store("fourth memory")
    cursor = index.cursor
    index.close()
    assert on_disk() == cursor
    reloaded = VectorIndex(EdgeEngine(tmp_path / "edge"))
    assert indexed_ids(reloaded, "a") == db_ids("a")
    reloaded.close()


@pytest.mark.django_db
def test_a_shard_searches_with_the_configured_pool_of_threads(settings, tmp_path):
    """VECTOR_INDEX_SEARCH_THREADS sizes the search pool of a new shard and of one loaded
    again (the value a shard was made with is replaced); 0 means one per CPU."""

    def stored_threads(index: VectorIndex) -> int:
        path = index.engine._path / "shard" / "edge_config.json"  # type: ignore[attr-defined]
        return json.loads(path.read_text()).get("max_search_threads")

    settings.DATA_DIR = tmp_path
    memory_store_many(items=[{"agent_id": "a", "content": "first memory"}])
    settings.VECTOR_INDEX_SEARCH_THREADS = 1
    index = VectorIndex(EdgeEngine(tmp_path / "edge"))
    index.catch_up()
    assert stored_threads(index) == 1
    index.close()
    for threads, stored in ((3, 3), (0, os.cpu_count())):
        settings.VECTOR_INDEX_SEARCH_THREADS = threads
        index = VectorIndex(EdgeEngine(tmp_path / "edge"))  # the shard loaded again
        assert stored_threads(index) == stored
        assert indexed_ids(index, "a") == db_ids("a")
        index.close()


@pytest.mark.django_db
def test_dense_scores_stay_exact_once_the_index_holds_int8_copies(settings, tmp_path, monkeypatch):
    """An indexed qdrant-edge segment scores int8 copies of the vectors; without rescoring the
    hits would carry scores about 1e-3 off (qdrant does not rescore by default)."""
    settings.DATA_DIR = tmp_path
    settings.MEMORY_NEAR_DUPLICATE = 1.01  # keep every text: they are much alike
    monkeypatch.setattr(vector_index, "HNSW_FULL_SCAN_KB", 1)  # index from the first KB on
    texts = [f"memory number {n}: the {word} report" for n in range(40) for word in ("red", "blue")]
    memory_store_many(items=[{"agent_id": "a", "content": text} for text in texts])
    index = VectorIndex(EdgeEngine(tmp_path / "edge"))
    index.catch_up()
    shard = index.engine._need_shard().info()  # type: ignore[attr-defined]
    # Every vector of every point (dense, BM25, BM25 with the previous turn's words and the
    # tokens) sits in indexed segments.
    assert shard.points_count == len(texts) and shard.indexed_vectors_count == 4 * len(texts)

    call = query_args("the blue report")
    hits = index.search(mode="dense", limit=10, **call)
    stored = {
        item.pk: np.frombuffer(bytes(item.embedding), dtype=np.float32)
        for item in MemoryItem.objects.all()
    }
    assert len(hits) == 10
    for pk, score in hits:
        assert score == pytest.approx(float(stored[pk] @ np.array(call["dense"])), abs=1e-5)
    index.close()


@pytest.mark.django_db
@pytest.mark.usefixtures("vector_engine")
def test_a_model_change_is_refused_until_a_reindex(api_client, capsys):
    from django.core.management import call_command

    api_client.post(
        "/memory/store", {"agent_id": "a", "content": "remember the milk"}, format="json"
    )
    MemoryItem.objects.update(embedding_model="some/other-model")
    reset_model_check()  # as a process started after the model change would
    response = api_client.post("/memory/store", {"agent_id": "a", "content": "new"}, format="json")
    assert response.status_code == 503
    assert "memory_reindex" in response.json()["detail"]
    call_command("memory_reindex")
    assert "Re-embedded 1 items" in capsys.readouterr().out
    assert (
        api_client.post(
            "/memory/store", {"agent_id": "a", "content": "new"}, format="json"
        ).status_code
        == 201
    )
    assert indexed_ids(get_vector_index(), "a", "milk new") == db_ids("a")


def test_importing_views_and_tasks_loads_no_model():
    code = (
        "import os, sys, django;"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'ferrum_memory.settings.test'; django.setup();"
        "import memory.views, memory.tasks, experience.views;"
        "engines = ('fastembed', 'onnxruntime', 'qdrant_client', 'qdrant_edge');"
        "print(sorted(m for m in engines if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_z_score_fusion_ranks_by_both_modes_and_ignores_a_flat_one():
    from uuid import uuid4

    from memory.vector_index import fuse_z_scores

    a, b, c = uuid4(), uuid4(), uuid4()
    # c is BM25's best by far but dense's worst; a is good in both.
    dense = {a: 0.52, b: 0.50, c: 0.30}
    bm25 = {a: 1.0, c: 9.0}  # b shares no term with the query: 0
    fused = fuse_z_scores([a, b, c], [dense, bm25])
    # By hand: dense mean 0.44, std 0.0993; BM25 mean 3.333, std 4.028.
    by_hand = {
        a: (0.52 - 0.44) / 0.09933 + (1 - 10 / 3) / 4.0277,  # 0.806 - 0.579
        b: (0.50 - 0.44) / 0.09933 + (0 - 10 / 3) / 4.0277,  # 0.604 - 0.828
        c: (0.30 - 0.44) / 0.09933 + (9 - 10 / 3) / 4.0277,  # -1.409 + 1.407
    }
    assert [pk for pk, _ in fused] == [a, c, b]
    assert dict(fused) == pytest.approx(by_hand, abs=1e-3)
    # A mode with one score for all (here BM25 found nothing) leaves dense's order as it is.
    assert [pk for pk, _ in fuse_z_scores([a, b, c], [dense, {}])] == [a, b, c]
    assert [pk for pk, _ in fuse_z_scores([b, a], [{a: 1.0, b: 1.0}])] == [b, a]  # a tie


@pytest.mark.django_db
@pytest.mark.usefixtures("vector_engine")
def test_hybrid_search_fuses_both_scores_of_every_candidate(settings, monkeypatch):
    """With 3 candidates per mode, some pooled items were ranked by one mode only; each must be
    fused with its real score in the other mode, not with a missing one."""
    from memory.vector_index import fuse_z_scores

    settings.MEMORY_NEAR_DUPLICATE = 1.01  # keep every text
    monkeypatch.setattr(vector_index, "PREFETCH", 3)
    texts = [
        "a report on the harvest of red fruit",
        "the quarterly report on red apples",
        "red apples grow in the orchard",
        "an orchard harvest of fruit in autumn",
        "fruit picking season began early",
        "crimson berries ripened in the sun",
        "the annual crop yield summary",
        "the quarterly budget meeting",
        "notes on the weather",
    ]
    memory_store_many(items=[{"agent_id": "a", "content": text} for text in texts])
    call = query_args("red fruit harvest report")
    index = get_vector_index()
    dense, bm25 = (dict(index.search(mode=mode, limit=100, **call)) for mode in ("dense", "sparse"))
    top_dense, top_bm25 = set(list(dense)[:3]), set(list(bm25)[:3])
    pool = list(top_dense | top_bm25)
    # The case to prove: a pooled item BM25 scores but did not rank among its top 3, and enough
    # distinct BM25 scores that losing it would move the pool's mean and spread.
    assert any(bm25.get(pk, 0) > 0 for pk in top_dense - top_bm25)
    assert len({bm25.get(pk, 0) for pk in pool}) >= 3
    expected = fuse_z_scores(pool, [dense, bm25])

    hits = index.search(mode="hybrid", limit=3, **call)

    assert [pk for pk, _ in hits] == [pk for pk, _ in expected[:3]]
    assert [score for _, score in hits] == pytest.approx([score for _, score in expected[:3]])
    # The whole pool, as neighbour context reads it: the same candidates and scores, not more.
    assert len(pool) > 3
    whole = index.search(mode="hybrid", limit=3, whole_pool=True, **call)
    assert [pk for pk, _ in whole] == [pk for pk, _ in expected]
    assert [score for _, score in whole] == pytest.approx([score for _, score in expected])


@pytest.mark.django_db
@pytest.mark.usefixtures("vector_engine")
def test_a_query_of_stopwords_only_is_ranked_by_dense_alone(settings):
    """BM25 drops stopwords, so such a query has no BM25 terms and adds nothing to the fusion."""
    settings.MEMORY_NEAR_DUPLICATE = 1.01
    texts = ["where is the meeting", "what was said at the meeting", "lunch was late", "it rained"]
    memory_store_many(items=[{"agent_id": "a", "content": text} for text in texts])
    call = query_args("where was it")
    assert call["sparse"].indices == []
    index = get_vector_index()
    dense = [pk for pk, _ in index.search(mode="dense", limit=10, **call)]
    assert [pk for pk, _ in index.search(mode="hybrid", limit=10, **call)] == dense
    assert len(dense) == len(texts)
