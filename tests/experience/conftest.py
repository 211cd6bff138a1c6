import pytest


@pytest.fixture
def send_tasks_to(monkeypatch):
    """send_tasks_to(url): tasks go to the broker at url instead of running in the test (the
    test settings run them eagerly). Celery caches its connection pools: they start afresh."""
    from experience import services
    from ferrum_memory.celery import app

    def use(url: str) -> None:
        # The replay draws then go through the process's tally: only explicit flushes, so
        # the test decides when they are published (test_replay_counts tests the thread).
        monkeypatch.setattr(services, "DRAW_FLUSH_SECONDS", 3600.0)
        monkeypatch.setitem(app.conf, "task_always_eager", False)
        monkeypatch.setitem(app.conf, "broker_url", url)
        monkeypatch.setattr(app, "_pool", None)
        monkeypatch.setattr(app.amqp, "_producer_pool", None)

    yield use
    services._tally.forget()  # a test's uncounted draws are not the next test's
