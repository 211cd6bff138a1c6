import importlib
import io
import os
import re
import secrets
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.management import call_command
from django.db.models import F
from django.test import Client
from rest_framework.exceptions import PermissionDenied
from rest_framework.test import APIRequestFactory

from ferrum_memory.core.client_ip import client_ip
from ferrum_memory.core.exceptions import Conflict, api_exception_handler
from ferrum_memory.core.models import ApiKey
from ferrum_memory.core.permissions import allowed_agent_ids, ensure_agent_allowed
from ferrum_memory.core.throttling import ApiKeyRateThrottle


def request_with(api_key: ApiKey | None):
    request = APIRequestFactory().get("/")
    request.auth = api_key
    return request


def test_agent_limited_key_may_only_use_its_agents():
    key = ApiKey(name="k", allowed_agent_ids=["a"])
    request = request_with(key)
    assert allowed_agent_ids(request) == ["a"]
    ensure_agent_allowed(request, "a")
    with pytest.raises(PermissionDenied, match="agent 'b'"):
        ensure_agent_allowed(request, "b")


def test_unlimited_key_may_use_every_agent():
    request = request_with(ApiKey(name="k"))
    assert allowed_agent_ids(request) is None
    ensure_agent_allowed(request, "anyone")


def test_requests_without_a_key_are_not_throttled_per_key():
    assert ApiKeyRateThrottle().get_cache_key(request_with(None), None) is None  # type: ignore[arg-type]


def test_service_errors_become_their_status_with_extra_fields():
    response = api_exception_handler(Conflict("stale version", current_version=3), {})
    assert response is not None
    assert response.status_code == 409
    assert response.data == {"detail": "stale version", "current_version": 3}


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (DjangoValidationError({"reward": ["not finite"]}), {"reward": ["not finite"]}),
        (DjangoValidationError("bad"), ["bad"]),
    ],
)
def test_django_validation_errors_become_400(error, expected):
    response = api_exception_handler(error, {})
    assert response is not None
    assert response.status_code == 400
    assert response.data == expected


def test_api_key_str_shows_name_and_prefix_only():
    assert str(ApiKey(name="ci", prefix="fm_abcdefg")) == "ci (fm_abcdefg…)"


def test_production_settings_pass_the_deploy_check(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ferrum_memory.settings.production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "FERRUM_DATA_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_settings_are_https_only(monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "x" * 50)
    production = importlib.import_module("ferrum_memory.settings.production")
    assert production.SECURE_SSL_REDIRECT and production.SESSION_COOKIE_SECURE
    assert production.SECURE_HSTS_SECONDS >= 31536000


# Admin hardening: login limits and security headers -----------------------------------------

LOGIN = "/admin/login/?next=/admin/"


def log_in(client, username, password, address="127.0.0.1"):
    """A login through the admin's form, as a browser sends it (axes sees the request)."""
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def fail_until_locked(client, username, address="127.0.0.1"):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = log_in(client, username, "wrong", address)
        assert response.status_code == 200  # the form again, with its error
        assert "Please enter the correct username" in response.content.decode()
    return log_in(client, username, "wrong", address)


def assert_locked_out(response):
    assert response.status_code == 429
    assert "too many login attempts" in response.content.decode()


@pytest.fixture
def curator(django_user_model):
    return django_user_model.objects.create_user("curator", password="right", is_staff=True)


@pytest.mark.django_db
def test_failed_admin_logins_lock_the_username_out_from_that_address(client, curator):
    assert_locked_out(fail_until_locked(client, "curator"))
    assert_locked_out(log_in(client, "curator", "right"))  # the right password is refused too
    assert client.get("/admin/").status_code == 302  # and no session was opened
    # Username and address together: the same admin from elsewhere still gets in, so that a
    # stranger's guesses cannot lock the real admin out.
    other = Client()
    assert log_in(other, "curator", "right", address="10.0.0.7").status_code == 302
    assert other.get("/admin/").status_code == 200


@pytest.mark.django_db
def test_a_lockout_ends_after_the_cool_off(client, curator):
    """The failures are aged in the database by the cool-off (a wait of 15 minutes, or a short
    cool-off that a loaded machine could outlast between two failures, would not be a test)."""
    from axes.models import AccessAttempt

    assert_locked_out(fail_until_locked(client, "curator"))
    cool_off = settings.AXES_COOLOFF_TIME
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - cool_off + timedelta(seconds=60))
    assert_locked_out(log_in(client, "curator", "right"))  # a minute short of the end
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - cool_off - timedelta(seconds=1))
    assert log_in(client, "curator", "right").status_code == 302
    assert client.get("/admin/").status_code == 200


@pytest.mark.django_db
def test_axes_reset_lifts_a_lockout(client, curator):
    assert_locked_out(fail_until_locked(client, "curator"))
    call_command("axes_reset", stdout=io.StringIO())
    assert log_in(client, "curator", "right").status_code == 302


@pytest.mark.django_db
def test_the_failures_are_kept_in_the_database(client, curator):
    """The DB handler: every process (and a restarted one) sees the same count."""
    from axes.models import AccessAttempt

    log_in(client, "curator", "wrong")
    log_in(client, "curator", "wrong")
    assert AccessAttempt.objects.get(username="curator").failures_since_start == 2


def test_the_login_limits_come_from_the_environment(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ferrum_memory.settings.base",
        "FERRUM_DATA_DIR": str(tmp_path),
        "ADMIN_LOGIN_FAILURE_LIMIT": "7",
        "ADMIN_LOGIN_COOLOFF_MINUTES": "2.5",
    }
    code = "from django.conf import settings as s; print(s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME)"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == ["7", "0:02:30"], result.stderr


SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/admin/login/",
        "/admin/",
        "/admin/experience/experience/",
        "/admin/experience/dreamcycle/dashboard/",
    ],
)
def test_admin_and_dashboard_answer_with_security_headers_and_a_strict_csp(admin_client, path):
    client = Client() if path == "/admin/login/" else admin_client  # an admin is redirected
    response = client.get(path)
    assert response.status_code == 200
    for header, value in SECURITY_HEADERS.items():
        assert response[header] == value, header
    policy = dict(
        (part.split()[0], part.split()[1:])
        for part in response["Content-Security-Policy"].split(";")
    )
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"] and policy["style-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    # No inline code is needed: the page has no <script> or <style> body of its own.
    html = response.content.decode()
    assert "<style" not in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)


@pytest.mark.django_db
def test_json_answers_carry_the_headers_but_no_policy(anon_client):
    """The policy is for documents (HtmlCSPMiddleware): the API's JSON skips building it."""
    response = anon_client.get("/health")
    assert response["Content-Type"] == "application/json"
    assert "Content-Security-Policy" not in response
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (0, "203.0.113.9", "10.0.0.1"),  # no proxy trusted: the header is the client's word
        (1, "203.0.113.9", "203.0.113.9"),
        (1, "198.51.100.1, 203.0.113.9", "203.0.113.9"),  # a forged entry on the left
        (2, "198.51.100.1, 203.0.113.9, 10.0.0.2", "203.0.113.9"),
        (2, "203.0.113.9", "10.0.0.1"),  # fewer hops than proxies: not through them
        (1, "", "10.0.0.1"),
    ],
)
def test_the_login_limits_count_the_address_the_outermost_trusted_proxy_saw(
    rf, settings, proxies, forwarded, expected
):
    settings.ADMIN_LOGIN_TRUSTED_PROXIES = proxies
    request = rf.get("/admin/login/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_ip(request) == expected


@pytest.mark.django_db
def test_behind_a_proxy_each_client_is_locked_out_on_its_own(client, curator, settings):
    settings.ADMIN_LOGIN_TRUSTED_PROXIES = 1
    attacker = {"HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    for _ in range(settings.AXES_FAILURE_LIMIT):
        response = client.post(LOGIN, {"username": "curator", "password": "no"}, **attacker)
    assert_locked_out(response)
    # A forged entry in front of the proxy's does not get the attacker out of the lockout.
    forged = {"HTTP_X_FORWARDED_FOR": "198.51.100.1, 203.0.113.9"}
    assert_locked_out(client.post(LOGIN, {"username": "curator", "password": "right"}, **forged))
    # The admin, through the same proxy (same REMOTE_ADDR) from their own address, gets in.
    admin = Client()
    response = admin.post(
        LOGIN,
        {"username": "curator", "password": "right"},
        HTTP_X_FORWARDED_FOR="192.0.2.4",
    )
    assert response.status_code == 302
