import pytest

from experience.replay_index import reset_replay_index


@pytest.fixture(autouse=True)
def fresh_replay_index():
    # Each test starts with no in-process index: it is rebuilt from the test's DB.
    reset_replay_index()
    yield
    reset_replay_index()
