"""End to end with a real Celery worker (and beat) on the test database: a session is started
and updated over the API, closed, consolidated by the worker, and its summary is found by
search."""

import pytest
from django_celery_beat.models import PeriodicTask

from sessions.models import Consolidation
from tests.experience.test_dream_e2e import celery_processes, process_env, wait_for
from tests.sessions.conftest import AGENT, chat


@pytest.mark.django_db(transaction=True)
def test_a_closed_session_is_consolidated_by_the_worker_and_found_by_search(
    api_client, tmp_path, send_tasks_to
):
    PeriodicTask.objects.update(enabled=False)  # only the close's task runs
    with celery_processes(tmp_path) as logs:
        send_tasks_to(process_env(tmp_path)["CELERY_BROKER_URL"])
        start = api_client.post(
            "/session/start",
            {"agent_id": AGENT, "task": "Renew the TLS certificate"},
            format="json",
        )
        assert start.status_code == 201, start.json()
        sid, version = start.json()["session_id"], 1
        for texts in (
            ("The certificate for api.example.com expires on the 14th of June.",),
            ("certbot failed because port 80 is closed on the load balancer.", "ok"),
            ("We decided to switch to the DNS-01 challenge with the Route53 plugin.",),
        ):
            response = api_client.put(
                f"/session/{sid}",
                {"version": version, "append_messages": chat(*texts, speaker="ops")},
                format="json",
            )
            assert response.status_code == 200, response.json()
            version = response.json()["version"]
        closed = api_client.post("/session/close", {"session_id": sid}, format="json")
        assert closed.status_code == 202, closed.json()
        task_id = closed.json()["task_id"]

        consolidation = wait_for(
            lambda: Consolidation.objects.filter(session_id=sid, status="done").first(),
            logs,
            "the worker to consolidate the session",
        )
        assert task_id in (tmp_path / "worker.log").read_text()
    assert consolidation.version == version == 4
    found = api_client.post(
        "/memory/search",
        {"agent_id": AGENT, "query": "When does the api.example.com certificate expire?"},
        format="json",
    ).json()["results"]
    summary = next(hit["item"] for hit in found if hit["item"]["kind"] == "session_summary")
    assert summary["point_id"] == str(consolidation.summary_item_id)
    assert summary["session_id"] == sid and summary["source"] == "consolidation"
    assert summary["content"].startswith("Task: Renew the TLS certificate\n")
    assert api_client.get(f"/session/{sid}").status_code == 410
