import importlib
import os
import secrets
import subprocess
import sys

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import PermissionDenied
from rest_framework.test import APIRequestFactory

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
