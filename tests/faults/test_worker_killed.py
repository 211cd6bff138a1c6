"""A Celery worker killed during consolidation, with real processes: the worker hangs inside
the consolidation task (a SESSION_SUMMARIZER that hangs on its first call), the test kills it
with SIGKILL (no chance to ack, reject or clean up), starts another worker, and the task runs
again there: the consolidation is done exactly once, with one set of memory items.

How it runs again: the dead run's claim is a lease (CELERY_TASK_TIME_LIMIT, 6 minutes); when it
ends, the idle sweep (a beat job) sends the consolidation again under the same task id. The
broker would not: the SQLite broker never redelivers a message a worker took, and Redis only
after its visibility timeout (1 hour). The test ends the lease instead of waiting 6 minutes,
and runs the sweep itself, as beat would."""

import signal

import pytest
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from memory.models import MemoryItem
from sessions.models import Consolidation
from sessions.services import session_sweep
from tests.experience.test_dream_e2e import process_env, wait_for
from tests.faults.conftest import worker_process
from tests.sessions.conftest import chat

AGENT = "killed"
TURNS = (
    "The nightly backup of the orders database failed with a disk full error.",
    "We decided to move the backups to the object store bucket ferrum-backups.",
    "The retention of the backups is thirty days from now on.",
)


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_consolidation_is_taken_over_and_consolidates_once(
    api_client, tmp_path, send_tasks_to
):
    PeriodicTask.objects.update(enabled=False)
    marker = tmp_path / "inside-consolidation"
    env = {
        "SESSION_SUMMARIZER": "tests.faults.summarizers.hang_the_first_time",
        "FAULT_MARKER": str(marker),
    }

    def logs() -> str:
        return "".join(
            f"--- {p.name} ---\n{p.read_text()}\n" for p in tmp_path.glob("worker-*.log")
        )

    with worker_process(tmp_path, "worker-a", **env) as first:
        send_tasks_to(process_env(tmp_path)["CELERY_BROKER_URL"])
        start = api_client.post(
            "/session/start", {"agent_id": AGENT, "task": "Fix the backups"}, format="json"
        )
        sid = start.json()["session_id"]
        updated = api_client.put(
            f"/session/{sid}", {"version": 1, "append_messages": chat(*TURNS)}, format="json"
        )
        assert updated.status_code == 200, updated.json()
        closed = api_client.post("/session/close", {"session_id": sid}, format="json")
        assert closed.status_code == 202, closed.json()
        task_id = closed.json()["task_id"]

        hung = wait_for(
            lambda: marker.exists() and marker.read_text(), logs, "the worker to hang in it"
        )
        assert int(hung) == first.pid
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=20)
    consolidation = Consolidation.objects.get(session_id=sid)
    assert (consolidation.status, consolidation.attempts) == ("running", 1)
    assert not MemoryItem.objects.filter(session_id=sid).exists()

    with worker_process(tmp_path, "worker-b", **env):
        # As if the 6 minutes of the dead run's lease had passed.
        Consolidation.objects.filter(pk=consolidation.pk).update(lease_until=timezone.now())
        assert session_sweep().resent == 1
        done = wait_for(
            lambda: Consolidation.objects.filter(pk=consolidation.pk, status="done").first(),
            logs,
            "the second worker to consolidate",
        )
        # The task commits "done" before the worker logs its success: wait for the line too
        # (a loaded machine wrote it after the test first read the logs).
        succeeded = f"Task sessions.consolidate[{task_id}] succeeded"
        wait_for(lambda: succeeded in logs(), logs, "the worker to log the task's success")

    assert done.attempts == 2
    assert Consolidation.objects.filter(session_id=sid).count() == 1
    items = MemoryItem.objects.filter(session_id=sid)
    assert sorted(str(pk) for pk in items.values_list("id", flat=True)) == sorted(
        done.memory_item_ids
    )
    [summary] = items.filter(kind="session_summary")
    assert summary.pk == done.summary_item_id
    assert summary.content.startswith("Summary of 3 turns: ")
    contents = list(items.values_list("content", flat=True))
    assert len(contents) == len(set(contents))  # no item twice
