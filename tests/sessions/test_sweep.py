"""The beat's sweep: idle sessions are consolidated before their TTL ends, so nothing is lost."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from memory.models import MemoryItem
from sessions.models import Consolidation, Session
from sessions.services import session_start, session_sweep, session_update
from sessions.tasks import sweep_sessions
from sessions.working_memory import get_working_memory
from tests.sessions.conftest import AGENT, chat

pytestmark = pytest.mark.django_db

TEXTS = (
    "The deployment to the staging cluster failed on the database migration.",
    "Rolling back the migration fixed staging; production stays on the old schema.",
)


def live_session(ttl: int):
    session, _ = session_start(agent_id=AGENT, fields={"task": "Deploy"}, ttl_seconds=ttl)
    session_update(session_id=session.pk, version=1, fields={}, append_messages=chat(*TEXTS))
    return Session.objects.get(pk=session.pk)


def test_the_default_schedule_is_registered():
    task = PeriodicTask.objects.get(name="sessions: consolidate idle")
    assert task.task == "sessions.sweep" and task.interval.every == 60


def test_an_idle_session_is_consolidated_before_the_store_forgets_it(
    api_client, store_engine, django_capture_on_commit_callbacks
):
    session = live_session(ttl=2)
    assert session.consolidate_after - session.last_activity_at == timedelta(seconds=1.6)
    early = session_sweep(now=session.last_activity_at + timedelta(seconds=1))
    assert early.consolidations == [] and not Consolidation.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        report = session_sweep(now=session.last_activity_at + timedelta(seconds=1.7))
    assert len(report.consolidations) == 1 and report.expired == 0
    consolidation = Consolidation.objects.get()
    assert consolidation.status == "done" and consolidation.reason == "idle"
    session.refresh_from_db()
    assert session.consolidated_version == 2 and session.status == "open"
    summary = MemoryItem.objects.get(pk=session.summary_item_id)
    assert "Rolling back the migration" in summary.content or "staging cluster" in summary.content

    # A second sweep does nothing more.
    assert session_sweep(now=session.last_activity_at + timedelta(seconds=1.8)).consolidations == []

    # The TTL ends for real: the store forgets the state, the consolidated content remains.
    time.sleep(max(0.0, (session.expires_at - timezone.now()).total_seconds()) + 0.3)
    assert get_working_memory().get(session_id=str(session.pk)) is None
    gone = api_client.get(f"/session/{session.pk}")
    assert gone.status_code == 410 and gone.json()["status"] == "expired"
    assert gone.json()["summary_item_id"] == str(summary.pk)
    assert session_sweep().expired == 1
    assert Session.objects.get(pk=session.pk).status == "expired"
    found = api_client.post(
        "/memory/search",
        {"agent_id": AGENT, "query": "why did the staging deployment fail?"},
        format="json",
    ).json()["results"]
    assert str(session.summary_item_id) in [hit["item"]["point_id"] for hit in found]


def test_the_database_store_loses_nothing_even_when_the_sweep_is_late(
    settings, django_capture_on_commit_callbacks
):
    settings.REDIS_URL = ""
    session = live_session(ttl=60)
    later = session.expires_at + timedelta(seconds=5)
    with django_capture_on_commit_callbacks(execute=True):
        report = session_sweep(now=later)
    assert len(report.consolidations) == 1
    assert report.expired == 1 and report.purged == 1  # snapshotted first, then dropped
    assert Consolidation.objects.get().status == "done"
    assert Session.objects.get(pk=session.pk).status == "expired"


def test_a_state_redis_already_forgot_is_skipped(settings, redis_url):
    settings.REDIS_URL = redis_url
    session = live_session(ttl=60)
    get_working_memory().delete(session_id=str(session.pk))
    report = session_sweep(now=session.expires_at + timedelta(seconds=1))
    assert report.consolidations == [] and report.expired == 1


def test_with_the_store_down_the_sweep_waits(settings, redis_url):
    settings.REDIS_URL = redis_url
    session = live_session(ttl=60)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    report = session_sweep(now=session.expires_at - timedelta(seconds=1))
    assert report.store_down and report.consolidations == [] and report.expired == 0
    assert Session.objects.get(pk=session.pk).status == "open"


def test_a_consolidation_whose_message_was_lost_is_sent_again(
    django_capture_on_commit_callbacks,
):
    from sessions.services import session_close

    session = live_session(ttl=600)
    consolidation = session_close(session_id=session.pk)  # on_commit not run: never sent
    assert Consolidation.objects.get().status == "pending"
    assert session_sweep().resent == 0  # too recent to call lost
    Consolidation.objects.update(created_at=timezone.now() - timedelta(minutes=5))
    result = sweep_sessions.apply().get()
    assert result["resent"] == 1
    consolidation.refresh_from_db()
    assert consolidation.status == "done"


def test_closing_with_the_broker_down_leaves_it_to_the_sweep(
    api_client, django_capture_on_commit_callbacks, send_tasks_to
):
    session = live_session(ttl=600)
    send_tasks_to("redis://127.0.0.1:1/0")
    from ferrum_memory.celery import app

    app.conf.broker_transport_options = {"max_retries": 0}
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = api_client.post(
                "/session/close", {"session_id": str(session.pk)}, format="json"
            )
    finally:
        app.conf.broker_transport_options = {}
    assert response.status_code == 202
    assert Consolidation.objects.get().status == "pending"
