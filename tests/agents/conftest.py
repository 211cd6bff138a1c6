import pytest

from experience.replay_index import reset_replay_index
from memory.services import reset_model_check
from memory.vector_index import reset_vector_index
from sessions.working_memory import reset_working_memory


@pytest.fixture(params=["edge", "server"])
def engines(request, settings, tmp_path):
    """A fresh qdrant-edge shard in a folder scanned below, or qdrant-client's in-process
    mode, the stand-in for a Qdrant server. A fresh replay index too: a transactional test's
    flush restarts the revision counters, which a process's index would take for no change."""
    settings.DATA_DIR = tmp_path
    settings.QDRANT_URL = "" if request.param == "edge" else ":memory:"
    settings.DREAM_MIN_EXPERIENCES = 1
    settings.DREAM_MAX_PENDING = 0
    reset_vector_index()
    reset_replay_index()
    reset_model_check()
    reset_working_memory()
    yield tmp_path
    reset_vector_index()
    reset_replay_index()
    reset_working_memory()
