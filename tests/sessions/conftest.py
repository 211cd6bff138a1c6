import pytest
from rest_framework.test import APIClient

from ferrum_memory.core.services import api_key_create
from memory.vector_index import reset_vector_index
from sessions.working_memory import reset_working_memory
from tests.experience.conftest import send_tasks_to  # noqa: F401 - a fixture, used by the e2e

AGENT = "agent-a"


@pytest.fixture(autouse=True)
def fresh_engines(settings, tmp_path):
    """A fresh working-memory store (the one the run configures: REDIS_URL) and a fresh
    qdrant-edge shard, since consolidation stores memory items."""
    settings.DATA_DIR = tmp_path
    settings.QDRANT_URL = ""
    reset_working_memory()
    reset_vector_index()
    yield
    reset_working_memory()
    reset_vector_index()


@pytest.fixture(params=["database", "redis"])
def store_engine(request, settings):
    """Each store test runs on both engines: the database table and a real Redis."""
    settings.REDIS_URL = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    reset_working_memory()
    yield request.param
    reset_working_memory()


def client_for(**key: object) -> APIClient:
    _, raw = api_key_create(name="scoped", **key)  # type: ignore[arg-type]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def chat(*texts: str, speaker: str = "Ada", at: str = "") -> list[dict[str, str]]:
    return [
        {"role": "user", "name": speaker, "content": text, **({"at": at} if at else {})}
        for text in texts
    ]
