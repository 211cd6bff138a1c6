import os
import socket
from urllib.parse import urlsplit

import pytest
from rest_framework.test import APIClient

from ferrum_memory.core.services import api_key_create


def require_service(url: str, what: str) -> str:
    """Return url when something listens there. Otherwise skip on a developer's machine, and
    fail in CI, where the service is part of the contract (never a silent skip)."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
    except OSError as exc:
        message = f"{what} is not reachable at {url}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return url


@pytest.fixture
def redis_url() -> str:
    return require_service(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"), "Redis")


@pytest.fixture
def api_key(db):
    api_key, raw_key = api_key_create(name="test")
    return api_key, raw_key


@pytest.fixture
def api_client(api_key) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
    return client


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture(autouse=True)
def fresh_replay_index():
    # Each test starts with no in-process replay index: it is rebuilt from the test's DB. Any
    # test may sample (dream cycles, erasure, access control), not only the experience tests.
    from experience.replay_index import reset_replay_index

    reset_replay_index()
    yield
    reset_replay_index()


@pytest.fixture(autouse=True)
def _clear_cache():
    # Throttle counters live in the cache (and each process's share of them in the
    # throttle); each test starts with a fresh budget and reads its API keys afresh.
    from django.core.cache import cache

    from ferrum_memory.core.selectors import api_key_forget
    from ferrum_memory.core.throttling import ApiKeyRateThrottle
    from memory.selectors import forget_word_piece_idf

    cache.clear()
    ApiKeyRateThrottle.forget_windows()
    api_key_forget()
    forget_word_piece_idf()  # the word pieces' counts of an earlier test's (rolled back) DB


_OPTIONS = pytest.StashKey[dict]()  # each test's DB OPTIONS as it started


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    from django.db import connection

    item.stash[_OPTIONS] = dict(connection.settings_dict["OPTIONS"])
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Fail a test that leaves the DB OPTIONS changed. The connections read the very OPTIONS
    dict of settings.DATABASES, which the `settings` fixture does not restore, so a change made
    in place reaches every later test (a 0.2 s lock wait once made later SQLite tests flaky).
    Checked once every fixture is torn down, monkeypatch's undo included."""
    from django.db import connection

    result = yield
    if connection.settings_dict["OPTIONS"] != item.stash[_OPTIONS]:
        raise AssertionError(f"{item.nodeid} left the DB OPTIONS changed; use monkeypatch")
    return result


def pytest_sessionfinish(session, exitstatus):
    # The test settings put the data folder in a fresh temporary directory; leave none behind.
    import shutil

    from django.conf import settings

    if settings.configured and settings.DATA_DIR.name.startswith("ferrum-test-"):
        shutil.rmtree(settings.DATA_DIR, ignore_errors=True)
