"""The replay dashboard in the admin: its figures, its SVG charts, and the page in Chromium."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from experience.charts import BAR_COLOUR, POINT_COLOUR, Datum, bar_chart, line_chart
from experience.dream_selectors import Bin, histogram, replay_dashboard, reward_over_time
from experience.dream_services import dream_cycle_claim, dream_cycle_complete, dream_cycle_run
from experience.models import DreamCycle, Experience
from experience.services import experience_create_many, experience_td_error_update
from tests.experience import browser
from tests.experience.browser import census
from tests.experience.dream_helpers import dream_settings, stock  # noqa: F401 - the fixture
from tests.experience.factories import experience_json

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("dream_settings")]
DASHBOARD = "/admin/experience/dreamcycle/dashboard/"
CHARTS = {
    "priority-histogram",
    "td-error-histogram",
    "reward-over-time",
    "pass-rate-over-time",
    "buffer-by-agent",
    "spi-ratio-over-time",
    "size-over-time",
}


def populate() -> None:
    """Three agents, TD errors spread out, rewards and test results over three hours, and
    cycles in each state."""
    start = timezone.now() - timedelta(hours=3)
    for hour in range(3):
        items = [
            experience_json(
                id=f"{agent}-{hour}-{n}",
                agent_id=agent,
                reward=hour - 1 + n / 10,
                test_result={"passed": n % 2 == 0},
            )
            for agent, count in (("alpha", 8), ("beta", 4), ("gamma", 2))
            for n in range(count)
        ]
        for item in items:
            item["experience_id"] = item.pop("id")
        experience_create_many(items=items, now=start + timedelta(hours=hour))
    rows = list(Experience.objects.filter(agent_id="alpha").order_by("id"))
    experience_td_error_update(
        updates=[(row.experience_id, (i - 10) / 3) for i, row in enumerate(rows)]
    )
    for _ in range(3):
        dream_cycle_run(agent_id="alpha")
    claimed = dream_cycle_claim(agent_id="alpha", learner="gpu-1")
    assert claimed is not None
    ids = set(claimed.items.values_list("experience_id", flat=True))
    dream_cycle_complete(
        cycle_id=claimed.pk, lease_token=claimed.lease_token, td_errors=[(i, 0.1) for i in ids]
    )
    dream_cycle_claim(agent_id="alpha", learner="gpu-2")


# The figures --------------------------------------------------------------------------------


def test_histogram_counts_each_value_in_its_bin():
    for value in (0.0, 0.1, 0.25, 0.5, 0.5, 0.99, 1.0):
        stock("a", 1, td_error=value)
    bins = histogram(Experience.objects.all(), "td_error", bins=4)
    assert [(b.low, b.high) for b in bins] == [(0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1)]
    # Half-open bins, except the last, which holds the maximum.
    assert [b.count for b in bins] == [2, 1, 2, 2]
    assert histogram(Experience.objects.none(), "td_error") == []
    same = histogram(Experience.objects.filter(td_error=0.5), "td_error")
    assert same == [Bin(0.5, 0.5, 2)]


def test_reward_and_pass_rate_per_hour_and_per_day():
    start = timezone.now().replace(minute=5) - timedelta(hours=5)
    for hour, (rewards, passed) in enumerate([([1.0, 0.0], [True, False]), ([-1.0], [True])]):
        items = [
            {**experience_json(reward=r, test_result={"passed": p}), "experience_id": f"{hour}{i}"}
            for i, (r, p) in enumerate(zip(rewards, passed, strict=True))
        ]
        experience_create_many(items=items, now=start + timedelta(hours=hour))
    kind, buckets = reward_over_time(Experience.objects.all())
    assert kind == "hour"
    assert [(b.reward_mean, b.pass_rate, b.count) for b in buckets] == [(0.5, 0.5, 2), (-1, 1, 1)]
    assert buckets[0].start == start.replace(minute=0, second=0, microsecond=0)

    old = {**experience_json(reward=3.0, test_result=None), "experience_id": "old"}
    experience_create_many(items=[old], now=start - timedelta(days=3))
    kind, buckets = reward_over_time(Experience.objects.all())
    assert kind == "day" and buckets[0].reward_mean == 3.0 and buckets[0].pass_rate is None
    assert reward_over_time(Experience.objects.none()) == ("hour", [])


def test_dashboard_figures_for_all_agents_and_one():
    populate()
    everyone = replay_dashboard()
    assert sum(b.count for b in everyone["priority_bins"]) == 42
    assert sum(b.count for b in everyone["td_error_bins"]) == 24  # alpha's TD errors
    assert everyone["agents"] == [("alpha", 24), ("beta", 12), ("gamma", 6)]
    assert everyone["cycle_counts"] == {"pending": 1, "claimed": 1, "completed": 1}
    assert [b.count for b in everyone["buckets"]] == [14, 14, 14]
    recent = everyone["recent_cycles"]
    assert [c.number for c in recent] == [3, 2, 1] and recent[0].item_count == 8
    done = next(c for c in recent if c.status == "completed")
    assert done.td_after == pytest.approx(0.1)
    assert done.td_before is not None and done.td_before > 0.1
    beta_only = replay_dashboard(agent_id="beta")
    assert sum(b.count for b in beta_only["priority_bins"]) == 12
    assert beta_only["td_error_bins"] == [] and beta_only["recent_cycles"] == []


# The charts ---------------------------------------------------------------------------------


def test_bar_chart_draws_a_bar_per_datum_and_escapes_labels():
    svg = bar_chart(
        name="t",
        title="<b>t</b>",
        data=[Datum("<script>x</script>", 3), Datum("b", 0), Datum("c", -2), Datum("gap", None)],
    )
    assert svg.count('class="bar"') == 3
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;b&gt;" in svg
    assert 'data-chart="t"' in svg and BAR_COLOUR in svg
    assert "No data yet" in bar_chart(name="e", title="e", data=[])


def test_line_chart_leaves_a_gap_for_missing_values():
    data = [Datum(str(i), v) for i, v in enumerate([0.1, 0.5, None, 0.7, 0.9, None])]
    svg = line_chart(name="t", title="t", data=data, low=0, high=1)
    assert svg.count('class="point"') == 4 and svg.count("<polyline") == 2
    assert POINT_COLOUR in svg
    assert "No data yet" in line_chart(name="e", title="e", data=[Datum("x", None)])
    flat = line_chart(name="f", title="f", data=[Datum("x", 2.0)])  # one value: still a scale
    assert flat.count('class="point"') == 1


# The page -----------------------------------------------------------------------------------


def test_dashboard_page_shows_every_chart_and_the_recent_cycles(admin_client):
    populate()
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    page = census(response.content.decode())
    assert set(page.marks) == CHARTS
    assert page.marks["priority-histogram"]["bar"] == 20
    assert page.marks["buffer-by-agent"]["bar"] == 3
    assert page.marks["reward-over-time"]["point"] == 3
    html = response.content.decode()
    assert 'id="recent-cycles"' in html and "gpu-1" in html and "completed: 1" in html

    one = census(admin_client.get(DASHBOARD + "?agent_id=gamma").content.decode())
    assert one.marks["td-error-histogram"]["empty"] == 1  # gamma has no TD errors
    assert one.marks["priority-histogram"]["bar"] == 1  # all of gamma's priorities are equal


def test_dashboard_page_with_nothing_yet(admin_client):
    page = admin_client.get(DASHBOARD).content.decode()
    assert census(page).marks == {name: {"empty": 1} for name in CHARTS}
    assert "No dream cycles yet." in page


def test_dashboard_needs_staff_with_view_permission(client):
    assert client.get(DASHBOARD).status_code == 302  # to the login page
    staff = User.objects.create_user("curator", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get(DASHBOARD).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_dreamcycle"))
    assert client.get(DASHBOARD).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_dashboard_renders_its_charts_in_headless_chromium(live_server, settings, tmp_path):
    """The page as a browser shows it: the DOM Chromium built holds every chart with its
    marks, the page fetches nothing from another host, the content security policy refuses
    nothing on it, and the screenshot has the bars' and points' colours in it (so the SVG was
    painted, not just parsed, and styled by its static stylesheet)."""
    binary = browser.require_chromium()
    settings.ROOT_URLCONF = "tests.experience.browser"
    populate()
    admin = User.objects.create_superuser("admin", "admin@example.com", "x")
    client = Client()
    client.force_login(admin)
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    url = browser.login_url(live_server.url, session_key, DASHBOARD)

    visit = browser.chromium(binary, tmp_path / "profile-dom", url, "--dump-dom")
    assert visit.csp_violations == [], visit.console
    dom = visit.stdout
    page = browser.census(dom)
    assert set(page.marks) == CHARTS, dom[:2000]
    assert page.marks["priority-histogram"]["bar"] == 20
    assert page.marks["td-error-histogram"]["bar"] == 20
    assert page.marks["buffer-by-agent"]["bar"] == 3
    assert page.marks["reward-over-time"]["point"] == 3
    assert page.marks["pass-rate-over-time"]["point"] == 3
    assert "gpu-1" in dom and DreamCycle.objects.count() == 3
    external = [r for r in page.resources if "://" in r and not r.startswith(live_server.url)]
    assert external == []

    shot = tmp_path / "dashboard.png"
    painted = browser.chromium(
        binary, tmp_path / "profile-shot", url, f"--screenshot={shot}", "--window-size=1280,1400"
    )
    assert painted.csp_violations == [], painted.console
    pixels = browser.png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == (1400, 1280)
    assert browser.count_colour(pixels, BAR_COLOUR) > 2_000  # the bars of three bar charts
    assert browser.count_colour(pixels, POINT_COLOUR) > 6 * 9  # six points, r=3


@pytest.mark.django_db(transaction=True)
def test_the_admin_runs_its_scripts_under_the_csp_without_a_violation(
    live_server, settings, tmp_path
):
    """The admin's pages that run scripts (the list with its actions and editable columns, the
    change form) load them as static files, which the policy allows: Chromium reports no
    violation and the scripts ran. A canary page with inline code, under the same policy, shows
    that a violation would be seen."""
    binary = browser.require_chromium()
    settings.ROOT_URLCONF = "tests.experience.browser"
    canary = browser.chromium(
        binary, tmp_path / "profile-canary", live_server.url + browser.CSP_CANARY, "--dump-dom"
    )
    assert len(canary.csp_violations) == 2, canary.console  # the inline style and script
    assert "<title>canary</title>" in canary.stdout  # the inline script did not run

    (row,) = stock("alpha", 1, td_error=1.0)
    admin = User.objects.create_superuser("admin", "admin@example.com", "x")
    client = Client()
    client.force_login(admin)
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    pages = ["/admin/experience/experience/", f"/admin/experience/experience/{row.pk}/change/"]
    for n, page in enumerate(pages):
        url = browser.login_url(live_server.url, session_key, page)
        visit = browser.chromium(binary, tmp_path / f"profile-{n}", url, "--dump-dom")
        assert visit.csp_violations == [], (page, visit.console)
        assert row.experience_id in visit.stdout, page
        assert 'data-theme="auto"' in visit.stdout, page  # the admin's theme.js ran
