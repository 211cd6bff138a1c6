"""Index servers (memory.index_server): real servers on real Unix sockets, in threads of the
test process (so that the test DB is theirs too), and once as deployed (subprocesses beside
gunicorn)."""

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from ferrum_memory.core.exceptions import Unavailable
from memory import index_server, vector_index
from memory.index_server import IndexServer, RemoteVectorIndex, busy_path, socket_path
from memory.models import MemoryItem
from memory.selectors import memory_search
from memory.services import memory_delete_many, memory_store_many
from memory.vector_index import EdgeEngine, VectorIndex
from tests.api.live_server import ROOT, live_server

from .test_vector_index import indexed_ids


@pytest.fixture
def servers(request, settings, tmp_path):
    """Two index servers in threads, and this process's index their client. Their graph
    builders run only when the test asks (`indirect` True): the others build by hand."""
    build_graphs = getattr(request, "param", False)
    settings.DATA_DIR = tmp_path
    settings.QDRANT_URL = ""
    settings.VECTOR_INDEX_SERVERS = 2
    vector_index.reset_vector_index()
    running = [IndexServer(slot) for slot in range(2)]
    threads = [
        threading.Thread(target=server.serve_forever, kwargs={"build_graphs": build_graphs})
        for server in running
    ]
    for thread in threads:
        thread.start()
    for slot in range(2):
        _wait_for(socket_path(slot))
    yield running
    for server in running:
        server.shutdown()
    for thread in threads:
        thread.join(timeout=10)
    vector_index.reset_vector_index()


def _wait_for(path: Path, seconds: float = 10) -> None:
    """Wait until the server at `path` accepts connections. The socket file exists from
    bind(), before listen(): a connect in between is refused (CI once saw both servers so)."""
    # A server coming up is waited for with a deadline, not timed.
    for _ in range(int(seconds / 0.02)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                return
            except (FileNotFoundError, ConnectionRefusedError):
                pass
        threading.Event().wait(0.02)
    raise AssertionError(f"{path} never accepted a connection")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("servers", [True], indirect=True)
def test_a_store_is_searchable_on_every_server_once_it_returns(servers):
    index = vector_index.get_vector_index()
    assert isinstance(index, RemoteVectorIndex) and index.engine_name == "IndexServers"
    stored = memory_store_many(items=[{"agent_id": "a", "content": "the lighthouse keeper"}])
    assert stored[0].indexed
    hits = memory_search(query="lighthouse", agent_id="a", limit=5, mode="hybrid")
    assert [hit.item.pk for hit in hits] == [stored[0].item.pk]
    # Each server answers from its own shard, caught up from the DB.
    for server in servers:
        assert indexed_ids(server.index, "a", "lighthouse") == {str(stored[0].item.pk)}
    memory_delete_many(queryset=MemoryItem.objects.filter(agent_id="a"))
    assert memory_search(query="lighthouse", agent_id="a", limit=5, mode="hybrid") == []
    # The search's server caught up to the delete; its home may have been building graphs
    # meanwhile (busy: skipped), so each server catches up before the cursors are compared.
    for server in servers:
        server.index.catch_up()
    assert index.cursor == servers[0].index.cursor == servers[1].index.cursor


@pytest.mark.django_db(transaction=True)
def test_a_server_building_graphs_is_marked_busy_and_skipped(servers, settings, monkeypatch):
    settings.MEMORY_NEAR_DUPLICATE = 1.01  # keep every text: they are much alike
    monkeypatch.setattr(vector_index, "HNSW_FULL_SCAN_KB", 1)  # graphs from the first KB on
    monkeypatch.setattr(vector_index, "OPTIMIZE_AFTER_POINTS", 5)
    index = vector_index.get_vector_index()
    builder = servers[index.home]
    builder.index.rebuild()  # empty, made with the lowered threshold
    builder.index.optimize()
    texts = [f"note {n} about the {w} harbour" for n in range(6) for w in ("red", "blue")]
    memory_store_many(items=[{"agent_id": "a", "content": text} for text in texts])
    builder.index.catch_up()
    assert builder.index.optimize_due()
    shard = builder.index.engine._need_shard()
    # Points waiting for their graphs (only the two BM25 inverted indexes are kept as they come)
    # are found all the same: a plain segment is scanned.
    assert shard.info().indexed_vectors_count == 2 * len(texts)
    assert len(indexed_ids(builder.index, "a", "harbour")) == len(texts)

    seen_busy = []
    optimize = builder.index.engine.optimize

    def watched() -> None:
        seen_busy.append(busy_path(builder.slot).exists())
        # A client asking now goes to the other server first.
        seen_busy.append(index._order()[0] != builder.slot)
        optimize()

    monkeypatch.setattr(builder.index.engine, "optimize", watched)
    assert builder.optimize_when_due() is True
    assert seen_busy == [True, True]
    assert not busy_path(builder.slot).exists() and not builder.index.optimize_due()
    # The build's shard was closed and loaded again (to give back the build's memory) before
    # the server stopped being busy; the graphs it built are on disk.
    reopened = builder.index.engine._need_shard()
    assert reopened is not shard
    assert reopened.info().indexed_vectors_count == 4 * len(texts)
    assert len(indexed_ids(builder.index, "a", "harbour")) == len(texts)
    assert builder.optimize_when_due() is False  # nothing added since


@pytest.mark.django_db(transaction=True)
def test_a_client_leaves_a_server_that_turns_busy_before_it_answers(servers, monkeypatch):
    index = vector_index.get_vector_index()
    silent = index.home
    # Its socket now leads to a listener that never answers, as a server that began building
    # graphs just after the request was sent; it marks itself busy a moment later.
    servers[silent].shutdown()
    path = socket_path(silent)
    path.unlink(missing_ok=True)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(path))
    mute.listen(8)
    marks = threading.Timer(0.3, busy_path(silent).touch)
    marks.start()
    try:
        memory_store_many(items=[{"agent_id": "a", "content": "the mute server"}])
        assert busy_path(silent).exists()  # the client waited until then, then asked the other
        assert len(memory_search(query="mute", agent_id="a", limit=5, mode="hybrid")) == 1
        # Both gone: the client says the index is unavailable.
        servers[1 - silent].shutdown()
        socket_path(1 - silent).unlink(missing_ok=True)
        index.close()  # its open connections too (a stopped process's would be gone)
        monkeypatch.setattr(index_server, "LAST_TRY_SECONDS", 0.2)
        with pytest.raises(Unavailable):
            index.catch_up()
    finally:
        marks.cancel()
        mute.close()


@pytest.mark.django_db(transaction=True)
def test_a_servers_error_is_raised_in_the_client(servers):
    index = vector_index.get_vector_index()
    with pytest.raises(ValueError, match="unknown index server operation"):
        index._call("compact", {})
    # An exception that cannot travel comes back as Unavailable, naming it.
    unpicklable = type("Local", (Exception,), {})("no")
    assert isinstance(index_server._portable(unpicklable), Unavailable)
    index.close()
    index.rebuild()  # on every server, over new connections
    assert all(server.index.cursor >= 0 for server in servers)


@pytest.mark.django_db(transaction=True)
def test_a_catch_up_without_optimize_inline_only_counts_what_is_due(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    index = VectorIndex(EdgeEngine(tmp_path / "edge"), optimize_inline=False)
    index.catch_up()
    assert index.optimize_due()  # a rebuild: everything waits for its graphs
    index.optimize()
    assert not index.optimize_due()
    memory_store_many(items=[{"agent_id": "a", "content": f"item {n}"} for n in range(3)])
    index.catch_up()
    assert index._unoptimized == 3 and not index.optimize_due()
    index.close()


@pytest.mark.django_db(transaction=True)
def test_points_an_optimize_left_unbuilt_still_count_toward_the_next(
    settings, tmp_path, monkeypatch
):
    """A server starting on a segment just below the optimizer's threshold builds nothing; its
    points must still count, or the segment would grow past the threshold unbuilt."""
    settings.DATA_DIR = tmp_path
    settings.MEMORY_NEAR_DUPLICATE = 1.01
    monkeypatch.setattr(vector_index, "OPTIMIZE_AFTER_POINTS", 4)
    monkeypatch.setattr(vector_index, "OPTIMIZE_RETRY_POINTS", 1)
    memory_store_many(items=[{"agent_id": "a", "content": f"item {n}"} for n in range(3)])
    index = VectorIndex(EdgeEngine(tmp_path / "edge"), optimize_inline=False)
    index.catch_up()  # a rebuild of 3 points, far below qdrant-edge's real threshold
    index.optimize()  # builds nothing
    assert index._unoptimized == 3 and not index.optimize_due()
    memory_store_many(items=[{"agent_id": "a", "content": "item 3"}])
    index.catch_up()
    assert index.optimize_due()
    index.close()


def test_index_servers_beside_gunicorn_as_deployed(tmp_path):
    """`manage.py memory_index_server` and gunicorn on one data folder: a store is searchable
    at once; one server killed, the other answers; the command stops its servers on SIGTERM."""
    with live_server(tmp_path, VECTOR_INDEX_SERVERS="2") as server:
        env = dict(server.env)
        command = subprocess.Popen(
            [sys.executable, "manage.py", "memory_index_server"], cwd=ROOT, env=env
        )
        try:
            for slot in range(2):
                _wait_for(tmp_path / "qdrant-edge" / f"server-{slot}.sock", seconds=180)
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {server.api_key}"
            url = server.base_url
            item: dict[str, Any] = {"agent_id": "a", "content": "the night ferry to the island"}
            stored = http.post(f"{url}/memory/store", json=item, timeout=60)
            assert stored.status_code == 201 and stored.json()["indexed"] is True
            query: dict[str, Any] = {"agent_id": "a", "query": "night ferry", "limit": 5}
            hits = http.post(f"{url}/memory/search", json=query, timeout=60).json()["results"]
            assert [hit["item"]["point_id"] for hit in hits] == [stored.json()["point_id"]]
            health = http.get(f"{url}/health", timeout=60).json()
            assert "IndexServers" in str(health)
            children = Path(f"/proc/{command.pid}/task/{command.pid}/children")
            # The servers indexed and answered without the dense model: the web process
            # embedded the query, and the vectors stored come from the DB.
            for pid in children.read_text().split():
                assert "onnxruntime" not in Path(f"/proc/{pid}/maps").read_text()
            killed = int(children.read_text().split()[0])
            os.kill(killed, signal.SIGKILL)
            for _ in range(3):
                answer = http.post(f"{url}/memory/search", json=query, timeout=60)
                assert answer.status_code == 200 and len(answer.json()["results"]) == 1
            # The command starts a dead server again.
            for _ in range(300):
                running = [int(pid) for pid in children.read_text().split()]
                if len(running) == 2 and killed not in running:
                    break
                threading.Event().wait(0.1)
            assert len(running) == 2 and killed not in running
        finally:
            command.terminate()
            assert command.wait(timeout=60) == 0
        assert not children.exists() or children.read_text().split() == []


@pytest.mark.django_db(transaction=True)
def test_a_shard_that_does_not_load_again_after_a_build_is_rebuilt_from_the_db(
    settings, tmp_path, monkeypatch
):
    """A build closes the shard and loads it again; should that load fail, the next catch-up
    rebuilds from the DB, as a process does on a damaged shard at start."""
    import qdrant_edge

    settings.DATA_DIR = tmp_path
    settings.MEMORY_NEAR_DUPLICATE = 1.01
    monkeypatch.setattr(vector_index, "HNSW_FULL_SCAN_KB", 1)  # graphs from the first KB on
    texts = [f"note {n} about the {w} harbour" for n in range(6) for w in ("red", "blue")]
    memory_store_many(items=[{"agent_id": "a", "content": text} for text in texts])
    index = VectorIndex(EdgeEngine(tmp_path / "edge"), optimize_inline=False)
    index.catch_up()

    class Unloadable:
        @staticmethod
        def load(path: str) -> Any:
            raise OSError(f"cannot load {path}")

    with monkeypatch.context() as failing:
        failing.setattr(qdrant_edge, "EdgeShard", Unloadable)
        index.optimize()
    assert index.cursor == -1  # no shard: the next catch-up rebuilds
    assert len(indexed_ids(index, "a", "harbour")) == len(texts)
    assert index.cursor >= 0
    index.close()
