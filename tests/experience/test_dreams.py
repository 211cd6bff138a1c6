"""Dream cycles: recording on schedule, the learner hand-off over the API, command, admin."""

import io
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from rest_framework.test import APIClient

import experience.dream_services as dream_services
from experience.apps import check_dream_settings
from experience.dream_services import (
    RUN_LOCK,
    dream_beta,
    dream_cycle_claim,
    dream_cycle_run,
    dream_cycles_run_due,
    dream_lock_acquire,
    dream_lock_release,
)
from experience.models import DreamCycle, DreamCycleItem, DreamLock, Experience
from experience.replay_index import get_replay_index
from experience.services import (
    experience_curate,
    experience_delete_many,
    experience_td_error_update,
    priority_from_td_error,
)
from experience.tasks import run_dream_cycles
from ferrum_memory.celery import app
from ferrum_memory.core.revisions import revision_state
from ferrum_memory.core.schedules import ensure_default_schedules
from ferrum_memory.core.services import api_key_create
from tests.experience.dream_helpers import dream_settings, stock  # noqa: F401 - the fixture
from tests.stats import P_VALUE_FLOOR, chi_square_p, normalised

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("dream_settings")]


def client_for(**key_options: object) -> APIClient:
    _, raw_key = api_key_create(name="learner-key", **key_options)  # type: ignore[arg-type]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def report(client: APIClient, body: dict, td: dict[str, float] | None = None) -> Any:
    """POST TD errors for every experience of a claimed cycle (body: its claim response)."""
    td = td or {}
    td_errors = [
        {"experience_id": eid, "td_error": td.get(eid, 0.5)}
        for eid in {item["experience_id"] for item in body["items"]}
    ]
    return client.post(
        f"/dream/cycles/{body['id']}/td-errors",
        {"lease_token": body["lease_token"], "td_errors": td_errors},
        format="json",
    )


# Recording cycles -------------------------------------------------------------------------------


def test_beta_anneals_linearly_from_beta0_to_1():
    # beta0 0.4 over 4 cycles: 0.4, 0.55, 0.7, 0.85, then 1 for good.
    assert [dream_beta(number=n) for n in range(1, 8)] == pytest.approx(
        [0.4, 0.55, 0.7, 0.85, 1.0, 1.0, 1.0]
    )


def test_beta_is_1_at_once_with_no_annealing(settings):
    settings.DREAM_BETA_ANNEAL_CYCLES = 0
    assert dream_beta(number=1) == 1.0


def test_a_cycle_records_probabilities_and_is_weights_of_the_replay_path():
    rows = stock("a", 6)
    td_errors = [0.1, 0.5, 1.0, 2.0, 4.0, 8.0]
    experience_td_error_update(
        updates=[(row.experience_id, td) for row, td in zip(rows, td_errors, strict=True)]
    )
    first = dream_cycle_run(agent_id="a", seed=1)
    second = dream_cycle_run(agent_id="a", seed=2)
    assert (first.number, second.number) == (1, 2)
    assert (first.beta, second.beta) == pytest.approx((0.4, 0.55))
    assert first.buffer_size == 6 and first.strategy == "prioritized"

    priority = {row.pk: priority_from_td_error(td) for row, td in zip(rows, td_errors, strict=True)}
    total, lowest = sum(priority.values()), min(priority.values())
    items = list(second.items.all())
    assert [item.position for item in items] == list(range(8))
    for item in items:
        p = priority[item.experience_pk] / total
        assert item.probability == pytest.approx(p)
        # w_i = (N P(i))^-beta / max_j w_j; the max weight is the least likely item's.
        assert item.weight == pytest.approx((p / (lowest / total)) ** -0.55)
        assert item.td_error_before == pytest.approx(
            td_errors[[r.pk for r in rows].index(item.experience_pk)]
        )


def test_a_cycle_marks_its_draws_sampled():
    stock("a", 5)
    cycle = dream_cycle_run(agent_id="a", seed=3)
    draws = list(cycle.items.values_list("experience_pk", flat=True))
    sampled = dict(Experience.objects.values_list("pk", "times_sampled"))
    assert sampled == {pk: draws.count(pk) for pk in sampled}  # with replacement: counted twice
    assert Experience.objects.filter(pk__in=draws, last_sampled_at=cycle.created_at).count() == len(
        set(draws)
    )


def test_dream_draws_follow_the_priorities(settings):
    """Chi-square over many cycles' draws: the cycles sample by priority, not uniformly."""
    settings.DREAM_BATCH_SIZE = 100
    rows = stock("a", 5)
    td_errors = [0.05, 0.3, 1.0, 2.0, 6.0]
    experience_td_error_update(
        updates=[(row.experience_id, td) for row, td in zip(rows, td_errors, strict=True)]
    )
    for seed in range(30):
        dream_cycle_run(agent_id="a", seed=seed)
    draws = np.array(DreamCycleItem.objects.values_list("experience_pk", flat=True))
    expected = normalised({row.pk: row.priority for row in Experience.objects.all()})
    assert chi_square_p(draws, expected) > P_VALUE_FLOOR
    # The same draws are clearly not uniform: the check above has the power to fail.
    assert chi_square_p(draws, normalised({pk: 1.0 for pk in expected})) < P_VALUE_FLOOR


def test_a_cycle_uses_the_configured_strategy(settings):
    settings.DREAM_STRATEGY = "uniform"
    stock("a", 4)
    cycle = dream_cycle_run(agent_id="a", seed=1)
    assert cycle.strategy == "uniform"
    assert [item.probability for item in cycle.items.all()] == pytest.approx([0.25] * 8)


def test_the_beat_run_dreams_for_each_agent_with_enough_experience():
    stock("a", 4)
    stock("b", 3)  # below DREAM_MIN_EXPERIENCES
    run = dream_cycles_run_due()
    assert run.locked and [cycle.agent_id for cycle in run.cycles] == ["a"]
    assert DreamCycle.objects.get().items.count() == 8


def test_an_agent_whose_priorities_are_all_zero_is_skipped():
    for row in stock("a", 4):
        experience_curate(experience=row, td_error=None, priority=0.0)
    stock("b", 4)
    run = dream_cycles_run_due()
    assert [cycle.agent_id for cycle in run.cycles] == ["b"]
    assert "Not enough experiences" in run.skipped["a"]


def test_an_agent_with_a_full_backlog_gets_no_new_cycle(settings):
    settings.DREAM_MAX_PENDING = 2
    stock("a", 4)
    assert [len(dream_cycles_run_due().cycles) for _ in range(3)] == [1, 1, 0]
    assert DreamCycle.objects.count() == 2
    DreamCycle.objects.filter(number=1).update(status=DreamCycle.Status.COMPLETED)
    assert len(dream_cycles_run_due().cycles) == 1


def test_two_runs_never_overlap_and_a_dead_runs_lock_expires():
    stock("a", 4)
    token = dream_lock_acquire(name=RUN_LOCK, seconds=60)
    assert token is not None
    run = dream_cycles_run_due()  # as if a second run started while the first one works
    assert not run.locked and run.cycles == [] and DreamCycle.objects.count() == 0
    assert dream_lock_acquire(name=RUN_LOCK, seconds=60) is None
    dream_lock_release(name=RUN_LOCK, token="not-the-holder")
    assert dream_lock_acquire(name=RUN_LOCK, seconds=60) is None
    dream_lock_release(name=RUN_LOCK, token=token)
    assert dream_cycles_run_due().locked

    # A holder that died keeps the lock only until its timeout.
    long_ago = timezone.now() - timedelta(hours=1)
    assert dream_lock_acquire(name=RUN_LOCK, seconds=60, now=long_ago) is not None
    assert dream_cycles_run_due().locked


def test_the_task_runs_the_beat_job():
    stock("a", 4)
    assert "experience.dream_cycles" in app.tasks
    result = run_dream_cycles()
    cycle = DreamCycle.objects.get()
    assert result == {"locked": True, "cycles": {"a": cycle.pk}, "skipped": {}}


def test_the_dream_schedule_is_created_and_an_admin_edit_survives_a_deploy(admin_client, settings):
    task = PeriodicTask.objects.get(name="experience: dream cycles")  # made by migrate
    assert task.task == "experience.dream_cycles"
    assert task.interval.every == settings.DREAM_INTERVAL_SECONDS
    assert (
        "experience: dream cycles"
        in admin_client.get("/admin/django_celery_beat/periodictask/").content.decode()
    )
    task.enabled = False
    task.save()
    assert ensure_default_schedules() == 0
    assert PeriodicTask.objects.get(name="experience: dream cycles").enabled is False


@pytest.mark.parametrize(
    "name, value",
    [
        ("DREAM_STRATEGY", "greedy"),
        ("DREAM_BETA0", 1.5),
        ("DREAM_BATCH_SIZE", 0),
        ("DREAM_BATCH_SIZE", 5000),
        ("DREAM_HALF_LIFE", 0.0),
        ("DREAM_INTERVAL_SECONDS", 0),
        ("DREAM_LEASE_SECONDS", 0),
    ],
)
def test_nonsense_dream_settings_stop_the_start(settings, name, value):
    check_dream_settings()
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        check_dream_settings()


# The learner hand-off ---------------------------------------------------------------------------


def test_claim_takes_the_oldest_cycle_with_its_experiences(api_client):
    stock("a", 4)
    first, second = dream_cycle_run(agent_id="a"), dream_cycle_run(agent_id="a")
    response = api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["id"] == first.pk and body["status"] == "claimed" and body["claimed_by"] == "test"
    assert body["item_count"] == 8 and len(body["items"]) == 8 and body["lease_token"]
    item = body["items"][0]
    assert item["experience"]["id"] == item["experience_id"]
    assert set(item) >= {"probability", "weight", "td_error_before", "td_error_after"}
    again = api_client.post(
        "/dream/cycles/claim", {"agent_id": "a", "learner": "gpu-1"}, format="json"
    ).json()
    assert again["id"] == second.pk and again["claimed_by"] == "gpu-1"
    assert (
        api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").status_code == 204
    )


def test_an_expired_lease_can_be_claimed_again_and_voids_the_old_token(api_client):
    stock("a", 4)
    cycle = dream_cycle_run(agent_id="a")
    stale = dream_cycle_claim(
        agent_id="a", learner="crashed", lease_seconds=60, now=timezone.now() - timedelta(hours=1)
    )
    assert stale is not None and stale.pk == cycle.pk
    body = api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").json()
    assert body["id"] == cycle.pk and body["claim_count"] == 2
    stale_body = {**body, "lease_token": stale.lease_token}
    assert report(api_client, stale_body).status_code == 409
    assert report(api_client, body).status_code == 200


def test_a_lease_that_has_not_expired_is_not_claimed_again(api_client):
    stock("a", 4)
    dream_cycle_run(agent_id="a")
    assert (
        api_client.post(
            "/dream/cycles/claim", {"agent_id": "a", "lease_seconds": 3600}, format="json"
        ).status_code
        == 200
    )
    assert (
        api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").status_code == 204
    )


def test_reported_td_errors_update_priorities_and_complete_the_cycle(api_client):
    stock("a", 6)
    cycle = dream_cycle_run(agent_id="a", seed=5)
    get_replay_index().catch_up()
    revision_before = revision_state(name="experience")[0]
    body = api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").json()
    drawn = sorted({item["experience_id"] for item in body["items"]})
    td = {eid: 0.25 * (i + 1) for i, eid in enumerate(drawn)}
    response = report(api_client, body, td)
    assert response.status_code == 200, response.json()
    result = response.json()
    assert result["cycle"]["status"] == "completed" and result["cycle"]["completed_at"]
    assert result["updated"] == len(drawn) and result["unknown_ids"] == []

    rows = {row.experience_id: row for row in Experience.objects.filter(experience_id__in=drawn)}
    for eid, value in td.items():
        assert rows[eid].td_error == value
        assert rows[eid].priority == pytest.approx(priority_from_td_error(value))
    # The revision moved, so every process's replay index sees the new priorities.
    assert revision_state(name="experience")[0] > revision_before
    index = get_replay_index()
    index.catch_up()
    seen = index.priorities("a")
    assert all(seen[rows[eid].pk] == pytest.approx(rows[eid].priority) for eid in drawn)
    after = dict(cycle.items.values_list("experience_id", "td_error_after"))
    assert after == td

    # Completed: a second report is refused, and the cycle is never claimed again.
    assert report(api_client, body).status_code == 409
    assert (
        api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").status_code == 204
    )
    detail = api_client.get(f"/dream/cycles/{cycle.pk}").json()
    assert detail["status"] == "completed" and "lease_token" not in detail


def test_a_report_must_cover_exactly_the_cycles_experiences(api_client):
    stock("a", 4)
    stock("b", 1, id="of-b")
    dream_cycle_run(agent_id="a")
    body = api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").json()
    drawn = sorted({item["experience_id"] for item in body["items"]})
    partial = [{"experience_id": eid, "td_error": 1.0} for eid in drawn[1:]]
    foreign = [
        *partial,
        {"experience_id": drawn[0], "td_error": 1.0},
        {"experience_id": "of-b", "td_error": 1.0},
    ]
    url = f"/dream/cycles/{body['id']}/td-errors"
    response = api_client.post(
        url, {"lease_token": body["lease_token"], "td_errors": partial}, format="json"
    )
    assert response.status_code == 409 and response.json()["missing_ids"] == drawn[:1]
    response = api_client.post(
        url, {"lease_token": body["lease_token"], "td_errors": foreign}, format="json"
    )
    assert response.status_code == 409 and response.json()["foreign_ids"] == ["of-b"]
    for bad in ("1.0", None, True):
        response = api_client.post(
            url,
            {
                "lease_token": body["lease_token"],
                "td_errors": [{"experience_id": drawn[0], "td_error": bad}],
            },
            format="json",
        )
        assert response.status_code == 400 and "td_errors" in response.json()
    assert DreamCycle.objects.get(pk=body["id"]).status == "claimed"
    assert not Experience.objects.exclude(td_error=None).exists()  # nothing half-written


def test_a_deleted_experience_is_reported_back_and_the_cycle_still_completes(api_client):
    stock("a", 4)
    dream_cycle_run(agent_id="a")
    body = api_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").json()
    gone = body["items"][0]["experience_id"]
    experience_delete_many(queryset=Experience.objects.filter(experience_id=gone))
    detail = api_client.get(f"/dream/cycles/{body['id']}").json()
    assert next(i["experience"] for i in detail["items"] if i["experience_id"] == gone) is None
    response = report(api_client, body)
    assert response.status_code == 200 and response.json()["unknown_ids"] == [gone]


def test_a_pending_cycle_cannot_be_completed(api_client):
    stock("a", 4)
    cycle = dream_cycle_run(agent_id="a")
    body = {
        "id": cycle.pk,
        "lease_token": "x" * 32,
        "items": [
            {"experience_id": eid} for eid in cycle.items.values_list("experience_id", flat=True)
        ],
    }
    assert report(api_client, body).status_code == 409
    assert (
        api_client.post(
            "/dream/cycles/999999/td-errors",
            {"lease_token": "x", "td_errors": [{"experience_id": "e", "td_error": 1}]},
            format="json",
        ).status_code
        == 404
    )


def test_list_filters_by_agent_and_status(api_client):
    stock("a", 4)
    stock("b", 4)
    a1, a2, b1 = (dream_cycle_run(agent_id=agent) for agent in ("a", "a", "b"))
    dream_cycle_claim(agent_id="a", learner="l")

    def ids(query: str = "") -> list[int]:
        response = api_client.get("/dream/cycles/" + query)
        assert response.status_code == 200, response.json()
        return [row["id"] for row in response.json()["results"]]

    assert ids() == [b1.pk, a2.pk, a1.pk]  # newest first
    assert ids("?agent_id=a") == [a2.pk, a1.pk]
    assert ids("?status=claimed") == [a1.pk]
    assert ids("?agent_id=a&status=pending") == [a2.pk]
    assert api_client.get("/dream/cycles").status_code == 200
    assert api_client.get("/dream/cycles/?status=lost").status_code == 400
    row = api_client.get("/dream/cycles/?agent_id=b").json()["results"][0]
    assert row["item_count"] == 8 and row["number"] == 1 and "items" not in row


def test_a_key_limited_to_agents_only_sees_and_handles_their_cycles():
    stock("a", 4)
    stock("b", 4)
    of_a, of_b = dream_cycle_run(agent_id="a"), dream_cycle_run(agent_id="b")
    client = client_for(allowed_agent_ids=["b"])
    listed = client.get("/dream/cycles/").json()["results"]
    assert [row["id"] for row in listed] == [of_b.pk]
    assert client.get("/dream/cycles/?agent_id=a").status_code == 403
    assert client.get(f"/dream/cycles/{of_a.pk}").status_code == 404
    assert client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").status_code == 403
    claimed = dream_cycle_claim(agent_id="a", learner="other")
    assert claimed is not None
    body = {
        "id": of_a.pk,
        "lease_token": claimed.lease_token,
        "items": [
            {"experience_id": eid} for eid in of_a.items.values_list("experience_id", flat=True)
        ],
    }
    assert report(client, body).status_code == 404  # even with the right token
    assert DreamCycle.objects.get(pk=of_a.pk).status == "claimed"
    assert client.post("/dream/cycles/claim", {"agent_id": "b"}, format="json").status_code == 200


def test_a_read_only_key_lists_but_cannot_claim_or_report():
    stock("a", 4)
    cycle = dream_cycle_run(agent_id="a")
    client = client_for(read_only=True)
    assert client.get("/dream/cycles/").status_code == 200
    assert client.get(f"/dream/cycles/{cycle.pk}").status_code == 200
    assert client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").status_code == 403
    claimed = dream_cycle_claim(agent_id="a", learner="l")
    assert claimed is not None
    body = {"id": cycle.pk, "lease_token": claimed.lease_token, "items": []}
    body["items"] = [
        {"experience_id": eid} for eid in cycle.items.values_list("experience_id", flat=True)
    ]
    assert report(client, body).status_code == 403
    assert DreamCycle.objects.get(pk=cycle.pk).status == "claimed"


def test_the_api_needs_a_key(anon_client):
    assert anon_client.get("/dream/cycles/").status_code == 401
    assert (
        anon_client.post("/dream/cycles/claim", {"agent_id": "a"}, format="json").status_code == 401
    )


def test_claim_validates_its_input(api_client):
    for body in (
        {},
        {"agent_id": "a", "lease_seconds": 0},
        {"agent_id": "a", "lease_seconds": 10**9},
    ):
        assert api_client.post("/dream/cycles/claim", body, format="json").status_code == 400


# Concurrent claimers ----------------------------------------------------------------------------


def race(claim: Callable[[str], int | None], claimers: int = 8) -> list[int]:
    """Start `claimers` threads at once, each claiming until nothing is left; every claim made."""
    barrier = threading.Barrier(claimers)
    claimed: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def claimer(number: int) -> None:
        try:
            barrier.wait(timeout=10)
            while (pk := claim(f"learner-{number}")) is not None:
                with guard:
                    claimed.append(pk)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    return claimed


def slow_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen the window between choosing a candidate and taking it, so claimers do collide."""
    original = dream_services._oldest_claimable

    def slow(**kwargs: object) -> int | None:
        candidate = original(**kwargs)  # type: ignore[arg-type]
        time.sleep(0.02)
        return candidate

    monkeypatch.setattr(dream_services, "_oldest_claimable", slow)


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_get_the_same_cycle(monkeypatch):
    stock("a", 4)
    cycles = [dream_cycle_run(agent_id="a").pk for _ in range(6)]
    slow_lookups(monkeypatch)

    def claim(learner: str) -> int | None:
        cycle = dream_cycle_claim(agent_id="a", learner=learner)
        return None if cycle is None else cycle.pk

    claimed = race(claim)
    assert sorted(claimed) == cycles  # every cycle claimed, and each exactly once
    assert set(DreamCycle.objects.values_list("claim_count", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_the_race_catches_a_claim_without_the_conditional_update():
    """The harness above can fail: a claim that reads, then updates blindly, double-assigns."""
    stock("a", 4)
    for _ in range(6):
        dream_cycle_run(agent_id="a")

    def naive_claim(learner: str) -> int | None:
        pending = DreamCycle.objects.filter(agent_id="a", status="pending").order_by("id")
        pk = pending.values_list("pk", flat=True).first()
        if pk is not None:
            time.sleep(0.02)
            DreamCycle.objects.filter(pk=pk).update(status="claimed", claimed_by=learner)
        return pk

    claimed = race(naive_claim)
    assert len(claimed) > len(set(claimed))


# The command and the admin ----------------------------------------------------------------------


def test_the_dream_command_runs_one_cycle_and_prints_it():
    rows = stock("a", 4)
    out = io.StringIO()
    call_command("dream", agent="a", seed=11, stdout=out)
    cycle = DreamCycle.objects.get()
    text = out.getvalue()
    assert f"Dream cycle {cycle.pk}: agent a #1, prioritized" in text and "seed 11" in text
    lines = text.splitlines()[2:]
    assert len(lines) == 8
    assert {line.split()[-1] for line in lines} <= {row.experience_id for row in rows}


def test_the_dream_command_explains_why_it_cannot_run():
    stock("a", 3)
    with pytest.raises(CommandError, match="Not enough experiences"):
        call_command("dream", agent="a", stdout=io.StringIO())
    stock("a", 1)
    token = dream_lock_acquire(name=RUN_LOCK, seconds=60)
    assert token is not None
    with pytest.raises(CommandError, match="in progress"):
        call_command("dream", agent="a", stdout=io.StringIO())


def test_admin_shows_cycles_read_only_with_their_items(admin_client):
    stock("a", 4)
    cycle = dream_cycle_run(agent_id="a")
    page = admin_client.get("/admin/experience/dreamcycle/").content.decode()
    assert "Replay dashboard" in page and "/admin/experience/dreamcycle/dashboard/" in page
    detail = admin_client.get(f"/admin/experience/dreamcycle/{cycle.pk}/change/")
    assert detail.status_code == 200
    html = detail.content.decode()
    first = cycle.items.first()
    assert first is not None and first.experience_id in html
    assert 'name="_save"' not in html  # read only
    assert admin_client.get("/admin/experience/dreamcycle/add/").status_code == 403


def test_admin_releases_a_lease_and_deletes_through_the_services(admin_client):
    stock("a", 4)
    claimed_cycle, other, third = (dream_cycle_run(agent_id="a") for _ in range(3))
    claimed = dream_cycle_claim(agent_id="a", learner="stuck")
    assert claimed is not None and claimed.pk == claimed_cycle.pk
    changelist = "/admin/experience/dreamcycle/"
    admin_client.post(
        changelist,
        {"action": "release_lease", "_selected_action": [claimed_cycle.pk, other.pk]},
    )
    released = DreamCycle.objects.get(pk=claimed_cycle.pk)
    assert released.status == "pending" and released.lease_token == ""
    admin_client.post(
        changelist, {"action": "delete_selected", "_selected_action": [other.pk], "post": "yes"}
    )
    admin_client.post(f"{changelist}{third.pk}/delete/", {"post": "yes"})
    assert list(DreamCycle.objects.values_list("pk", flat=True)) == [claimed_cycle.pk]
    assert DreamCycleItem.objects.exclude(cycle=claimed_cycle).count() == 0
    assert str(released) == "a #1" and str(released.items.first()).startswith("a #1 [0] ")


def test_only_staff_who_may_change_cycles_may_release_a_lease(client):
    viewer = User.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_dreamcycle"))
    client.force_login(viewer)
    stock("a", 4)
    dream_cycle_run(agent_id="a")
    assert (
        'value="release_lease"' not in client.get("/admin/experience/dreamcycle/").content.decode()
    )
    viewer.user_permissions.add(Permission.objects.get(codename="change_dreamcycle"))
    assert 'value="release_lease"' in client.get("/admin/experience/dreamcycle/").content.decode()


def test_the_run_lock_reads_as_its_holder_and_expiry():
    dream_lock_acquire(name=RUN_LOCK, seconds=60)
    assert str(DreamLock.objects.get()).startswith(f"{RUN_LOCK} until 20")
