"""A qdrant-edge shard folder left unusable (its files or its state.json damaged, as a crash
or a bad disk would leave them) is rebuilt from the DB by itself: the process that claims the
folder rebuilds it on its first catch-up, /health reports the index as rebuilding meanwhile,
and search finds every item afterwards. In this process, then through a real gunicorn."""

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from memory.models import MemoryItem
from memory.services import memory_store_many
from memory.vector_index import EdgeEngine, VectorIndex

AGENT = "corrupt"
TEXTS = (
    "The nightly backup of the orders database failed with a disk full error.",
    "We moved the backups to the object store bucket ferrum-backups.",
    "The retention of the backups is thirty days from now on.",
)


def overwrite(pattern: str, data: bytes) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        files = sorted(folder.glob(pattern))
        assert files, pattern
        for path in files:
            path.write_bytes(data)

    return damage


def remove(pattern: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        paths = sorted(folder.glob(pattern))
        assert paths, pattern
        for path in paths:
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    return damage


DAMAGE = {
    "state cut short": overwrite("state.json", b'{"cursor": 3, "mod'),
    "state not an object": overwrite("state.json", b"[3]"),
    "state empty": overwrite("state.json", b""),
    "shard config garbage": overwrite("shard/edge_config.json", b"{garbage"),
    "segment description garbage": overwrite("shard/segments/*/segment.json", b"\x00" * 64),
    "id mappings garbage": overwrite("shard/segments/*/mutable_id_tracker.mappings", b"\xff" * 99),
    "write-ahead log garbage": overwrite("shard/wal/open-1", b"\xab" * 4096),
    "segments gone": remove("shard/segments"),
}


def indexed_ids(engine: EdgeEngine) -> set[str]:
    from qdrant_edge import ScrollRequest

    records, _ = engine._need_shard().scroll(ScrollRequest(limit=1000, with_payload=False))
    return {str(record.id) for record in records}


def db_ids() -> set[str]:
    return {str(pk) for pk in MemoryItem.objects.values_list("id", flat=True)}


def built_folder(root: Path) -> Path:
    """A shard folder holding every item, closed as a process leaves it."""
    memory_store_many(items=[{"agent_id": AGENT, "content": text} for text in TEXTS])
    index = VectorIndex(EdgeEngine(root))
    index.catch_up()
    folder: Path = index.engine._path  # type: ignore[attr-defined]
    assert indexed_ids(index.engine) == db_ids()  # type: ignore[arg-type]
    index.close()
    return folder


@pytest.mark.django_db
@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_shard_folder_is_rebuilt_by_the_process_claiming_it(damage, tmp_path):
    root = tmp_path / "qdrant-edge"
    folder = built_folder(root)
    damage(folder)

    index = VectorIndex(EdgeEngine(root))
    assert index.engine._path == folder  # type: ignore[attr-defined]  # reused, not a new one
    assert index.cursor == -1  # unusable: to rebuild
    index.catch_up()
    assert index.cursor >= 0
    assert indexed_ids(index.engine) == db_ids()  # type: ignore[arg-type]
    index.close()
    again = VectorIndex(EdgeEngine(root))  # and the rebuilt folder opens as it should
    assert again.cursor == index.cursor and indexed_ids(again.engine) == db_ids()  # type: ignore[arg-type]
    again.close()
