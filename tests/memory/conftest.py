import pytest

from memory.services import reset_model_check
from memory.vector_index import reset_vector_index


@pytest.fixture(params=["edge", "server"])
def vector_engine(request, settings, tmp_path):
    """Each memory test runs on both engines: qdrant-edge in a fresh data folder, and
    qdrant-client's in-process mode, the stand-in for a Qdrant server (no server binary
    installs here)."""
    settings.DATA_DIR = tmp_path
    settings.QDRANT_URL = "" if request.param == "edge" else ":memory:"
    reset_vector_index()
    reset_model_check()
    yield request.param
    reset_vector_index()
