import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType

from experience.models import Experience, ExperienceTombstone
from experience.replay_index import get_replay_index
from experience.services import priority_from_td_error
from tests.experience.factories import store

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/experience/experience/"


def changelist_edit(admin_client, rows, **changes):
    """POST the changelist's list_editable form, as the Save button does."""
    data = {
        "form-TOTAL_FORMS": str(len(rows)),
        "form-INITIAL_FORMS": str(len(rows)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for i, row in enumerate(rows):
        edit = changes.get(row.experience_id, {})
        data[f"form-{i}-id"] = str(row.pk)
        data[f"form-{i}-td_error"] = str(
            edit.get("td_error", "" if row.td_error is None else row.td_error)
        )
        data[f"form-{i}-priority"] = str(edit.get("priority", row.priority))
    return admin_client.post(CHANGELIST, data)


def test_changelist_shows_and_filters(admin_client):
    booked = store(agent_id="a", task="book a flight " * 20, reward=1.0)
    store(agent_id="b", task="cancel a reservation", reward=-0.5)
    Experience.objects.filter(pk=booked.pk).update(times_sampled=1)
    page = admin_client.get(CHANGELIST).content.decode()
    assert "book a flight" in page and "…" in page
    for query in ("?reward_sign=negative", "?sampled=no", "?agent_id=b", "?q=cancel"):
        page = admin_client.get(CHANGELIST + query).content.decode()
        assert "cancel a reservation" in page and "book a flight" not in page, query
    assert "book a flight" in admin_client.get(CHANGELIST + "?sampled=yes").content.decode()
    assert (
        "cancel a reservation" not in admin_client.get(CHANGELIST + "?sampled=yes").content.decode()
    )
    assert (
        "cancel a reservation"
        not in admin_client.get(CHANGELIST + "?reward_sign=positive").content.decode()
    )
    assert (
        "cancel a reservation"
        not in admin_client.get(CHANGELIST + "?reward_sign=zero").content.decode()
    )


def test_detail_shows_tool_calls_readably(admin_client):
    row = store(tool_calls=[{"name": "search_flights", "arguments": {"origin": "JFK"}}])
    page = admin_client.get(f"{CHANGELIST}{row.pk}/change/").content.decode()
    assert "<pre>[\n  {\n    &quot;name&quot;: &quot;search_flights&quot;" in page


def test_list_edits_go_through_services_and_reach_the_next_replay(admin_client):
    rows = [store(td_error=1.0), store(td_error=1.0)]
    index = get_replay_index()
    index.catch_up()
    response = changelist_edit(
        admin_client,
        rows,
        **{rows[0].experience_id: {"priority": 42.0}, rows[1].experience_id: {"td_error": 3.0}},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    index.catch_up()
    assert index.priorities() == {
        rows[0].pk: 42.0,
        rows[1].pk: pytest.approx(priority_from_td_error(3.0)),
    }


def test_actions_reset_recompute_and_delete(admin_client):
    rows = [store(td_error=2.0), store(td_error=0.5), store()]
    index = get_replay_index()
    Experience.objects.filter(pk=rows[1].pk).update(priority=7.0)  # an earlier override

    def act(action, selected):
        return admin_client.post(
            CHANGELIST,
            {"action": action, "_selected_action": [r.pk for r in selected]},
            follow=True,
        )

    assert (
        "Recomputed the priority of 1"
        in act("recompute_priority", [rows[1], rows[2]]).content.decode()
    )
    assert Experience.objects.get(pk=rows[1].pk).priority == pytest.approx(
        priority_from_td_error(0.5)
    )

    act("reset_priority_to_max", [rows[1]])
    top = priority_from_td_error(2.0)
    assert Experience.objects.get(pk=rows[1].pk).priority == pytest.approx(top)

    index.catch_up()
    assert "Deleted 1" in act("delete_selected_experiences", [rows[0]]).content.decode()
    deletion = LogEntry.objects.get(action_flag=DELETION)
    assert (deletion.object_id, deletion.user.username) == (str(rows[0].pk), "admin")
    assert ExperienceTombstone.objects.filter(experience_pk=rows[0].pk).exists()
    index.catch_up()
    assert set(index.priorities()) == {rows[1].pk, rows[2].pk}
    assert index.priorities()[rows[1].pk] == pytest.approx(top)


def test_delete_from_the_detail_page_leaves_a_tombstone(admin_client):
    row = store()
    response = admin_client.post(f"{CHANGELIST}{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Experience.objects.exists()
    assert ExperienceTombstone.objects.filter(experience_pk=row.pk).exists()


def test_no_add_button_and_no_plain_bulk_delete(admin_client):
    assert admin_client.get(CHANGELIST + "add/").status_code == 403
    assert 'value="delete_selected"' not in admin_client.get(CHANGELIST).content.decode()
    assert settings.REPLAY_ALPHA > 0


# The admin's log of curation -----------------------------------------------------------------


def curation_log(row):
    """The admin log's change entries of one experience: (user, message), oldest first."""
    entries = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(Experience),
        object_id=str(row.pk),
        action_flag=CHANGE,
    ).order_by("id")
    return [(entry.user.username, entry.get_change_message()) for entry in entries]


def test_a_change_form_edit_is_logged_with_the_user_and_both_values(admin_client, admin_user):
    row = store(td_error=1.0)
    before = row.priority
    response = admin_client.post(
        f"{CHANGELIST}{row.pk}/change/", {"td_error": "3.0", "priority": str(before)}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    after = Experience.objects.get(pk=row.pk).priority
    assert after == pytest.approx(priority_from_td_error(3.0)) and after != before
    assert curation_log(row) == [
        (
            admin_user.username,
            f"Changed: TD error from 1.0 to 3.0, priority from {before!r} to {after!r}.",
        )
    ]
    # A priority override alone names only the priority.
    admin_client.post(f"{CHANGELIST}{row.pk}/change/", {"td_error": "3.0", "priority": "9.5"})
    assert curation_log(row)[-1] == (
        admin_user.username,
        f"Changed: priority from {after!r} to 9.5.",
    )


def test_list_edits_are_logged_per_row_changed(admin_client, admin_user):
    rows = [store(td_error=1.0), store(td_error=1.0), store(td_error=1.0)]
    old = rows[0].priority
    changelist_edit(
        admin_client,
        rows,
        **{rows[0].experience_id: {"priority": 42.0}, rows[1].experience_id: {"td_error": 0.0}},
    )
    new = Experience.objects.get(pk=rows[1].pk).priority
    assert curation_log(rows[0]) == [
        (admin_user.username, f"Changed: priority from {old!r} to 42.0.")
    ]
    assert curation_log(rows[1]) == [
        (
            admin_user.username,
            f"Changed: TD error from 1.0 to 0.0, priority from {old!r} to {new!r}.",
        )
    ]
    assert curation_log(rows[2]) == []  # not edited


def test_bulk_actions_log_each_changed_priority_with_the_user(admin_client, admin_user):
    rows = [store(td_error=2.0), store(td_error=0.5), store()]
    Experience.objects.filter(pk=rows[1].pk).update(priority=7.0)  # an earlier override
    computed = priority_from_td_error(0.5)
    admin_client.post(
        CHANGELIST,
        {"action": "recompute_priority", "_selected_action": [r.pk for r in rows]},
    )
    assert curation_log(rows[1]) == [
        (
            admin_user.username,
            f"Recomputed priority from the TD error: priority from 7.0 to {computed!r}.",
        )
    ]
    # Rows whose priority the action left as it was (no TD error, or already computed) are
    # not logged as changed.
    assert curation_log(rows[0]) == [] and curation_log(rows[2]) == []

    admin_client.post(
        CHANGELIST, {"action": "reset_priority_to_max", "_selected_action": [rows[1].pk]}
    )
    top = Experience.objects.get(pk=rows[1].pk).priority
    assert top == pytest.approx(priority_from_td_error(2.0))
    assert curation_log(rows[1])[-1] == (
        admin_user.username,
        f"Reset priority to the agent's max: priority from {computed!r} to {top!r}.",
    )
    # The log is the admin's own: the object's history page shows it.
    history = admin_client.get(f"{CHANGELIST}{rows[1].pk}/history/").content.decode()
    assert f"Reset priority to the agent&#x27;s max: priority from {computed!r}" in history
