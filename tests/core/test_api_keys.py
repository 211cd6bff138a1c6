import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.test import APIClient, APIRequestFactory

from ferrum_memory.core.authentication import ApiKeyAuthentication
from ferrum_memory.core.models import ApiKey
from ferrum_memory.core.services import api_key_create, api_key_hash

pytestmark = pytest.mark.django_db


def client_for(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def test_key_is_stored_hashed_only():
    api_key, raw_key = api_key_create(name="ci", allowed_agent_ids=["a"], read_only=True)
    api_key.refresh_from_db()
    assert api_key.key_hash == api_key_hash(raw_key)
    assert raw_key not in {api_key.key_hash, api_key.prefix}
    assert raw_key.startswith(api_key.prefix)
    assert api_key.allowed_agent_ids == ["a"] and api_key.read_only


def test_request_without_key_gets_401_with_challenge(anon_client):
    response = anon_client.get("/stats")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "API key is required" in response.json()["detail"]


@pytest.mark.parametrize("header", ["Bearer nope", "Bearer", "Bearer a b", "Bearer \xff"])
def test_bad_key_gets_401(anon_client, header):
    response = anon_client.get("/stats", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401


def test_valid_key_succeeds_and_records_last_use(api_client, api_key):
    assert api_key[0].last_used_at is None
    response = api_client.get("/stats")
    assert response.status_code == 200
    api_key[0].refresh_from_db()
    assert api_key[0].last_used_at is not None
    assert response.wsgi_request.user.is_authenticated


def test_revoked_key_gets_401(api_client, api_key):
    ApiKey.objects.filter(pk=api_key[0].pk).update(is_active=False)
    assert api_client.get("/stats").status_code == 401


def test_read_only_key_cannot_write():
    _, raw_key = api_key_create(name="ro", read_only=True)
    client = client_for(raw_key)
    assert client.get("/stats").status_code == 200
    response = client.post("/stats", {}, format="json")
    assert response.status_code == 403
    assert "read-only" in response.json()["detail"]


def test_create_api_key_command_prints_a_working_key(capsys):
    call_command("create_api_key", "cli", "--agent", "a1", "--agent", "a2", "--read-only")
    raw_key = capsys.readouterr().out.strip()
    api_key = ApiKey.objects.get(name="cli")
    assert api_key.key_hash == api_key_hash(raw_key)
    assert api_key.allowed_agent_ids == ["a1", "a2"] and api_key.read_only
    assert client_for(raw_key).get("/stats").status_code == 200


def test_rotate_deactivates_keys_of_the_same_name(capsys):
    call_command("create_api_key", "dev")
    first = capsys.readouterr().out.strip()
    call_command("create_api_key", "dev", "--rotate")
    second = capsys.readouterr().out.strip()
    assert client_for(first).get("/stats").status_code == 401
    assert client_for(second).get("/stats").status_code == 200


def test_throttle_is_per_key(monkeypatch):
    from ferrum_memory.core.throttling import ApiKeyRateThrottle

    # DRF reads the rates once at import; patch the class the way it would have read them.
    monkeypatch.setattr(ApiKeyRateThrottle, "THROTTLE_RATES", {"api_key": "3/min"})
    first = client_for(api_key_create(name="a")[1])
    second = client_for(api_key_create(name="b")[1])
    assert [first.get("/stats").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert second.get("/stats").status_code == 200


def test_throttle_window_says_when_it_ends_and_the_next_one_starts_afresh(monkeypatch):
    from ferrum_memory.core.throttling import ApiKeyRateThrottle

    monkeypatch.setattr(ApiKeyRateThrottle, "THROTTLE_RATES", {"api_key": "2/min"})
    # The throttle's clock, moved by hand so a test need not wait a minute: 10 s into a window.
    clock = [60.0 * 1000 + 10.0]
    monkeypatch.setattr(ApiKeyRateThrottle, "timer", lambda self: clock[0])
    client = client_for(api_key_create(name="a")[1])
    assert [client.get("/stats").status_code for _ in range(3)] == [200, 200, 429]
    over = client.get("/stats")
    assert over.status_code == 429
    assert over["Retry-After"] == "50"
    clock[0] += 50.0  # the next window
    assert client.get("/stats").status_code == 200


# The authentication cache (core/selectors.py) and the last-use write ----------------------------


def _authenticate(raw_key: str) -> ApiKey | None:
    request = APIRequestFactory().get("/stats", HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    found = ApiKeyAuthentication().authenticate(request)
    return None if found is None else found[0]


def test_a_key_is_read_from_the_db_once_per_cache_period(settings, django_assert_num_queries):
    settings.API_KEY_CACHE_SECONDS = 60
    api_key, raw_key = api_key_create(name="cached")
    with django_assert_num_queries(2):  # the key, and its first use recorded
        assert _authenticate(raw_key) == api_key
    with django_assert_num_queries(0):  # cached; last use was recorded less than a minute ago
        assert _authenticate(raw_key) == api_key


def test_with_no_cache_period_every_request_reads_the_key(settings, django_assert_num_queries):
    settings.API_KEY_CACHE_SECONDS = 0
    _, raw_key = api_key_create(name="uncached")
    _authenticate(raw_key)
    with django_assert_num_queries(1):
        _authenticate(raw_key)


@pytest.mark.parametrize("change", ["revoke", "delete", "rotate"])
def test_a_key_changed_in_this_process_stops_at_once(settings, change):
    settings.API_KEY_CACHE_SECONDS = 3600
    api_key, raw_key = api_key_create(name="dev")
    client = client_for(raw_key)
    assert client.get("/stats").status_code == 200  # now cached
    if change == "revoke":  # as the admin's change form does
        api_key.is_active = False
        api_key.save()
    elif change == "delete":  # as the admin's delete (one key, or a bulk delete) does
        ApiKey.objects.filter(pk=api_key.pk).delete()
    else:
        call_command("create_api_key", "dev", "--rotate")
    assert client.get("/stats").status_code == 401


def test_an_edit_in_this_process_applies_at_once(settings):
    settings.API_KEY_CACHE_SECONDS = 3600
    api_key, raw_key = api_key_create(name="dev")
    client = client_for(raw_key)
    assert client.post("/memory/store", {}, format="json").status_code == 400  # may write
    api_key.read_only = True
    api_key.save()
    assert client.post("/memory/store", {}, format="json").status_code == 403


def test_a_key_revoked_elsewhere_stops_within_the_cache_period(settings):
    settings.API_KEY_CACHE_SECONDS = 0.5
    api_key, raw_key = api_key_create(name="dev")
    assert _authenticate(raw_key) == api_key
    # Another process's write: an UPDATE this process hears nothing about.
    ApiKey.objects.filter(pk=api_key.pk).update(is_active=False)
    assert _authenticate(raw_key) == api_key  # the stated bound: cached for 0.5 s
    time.sleep(0.6)
    with pytest.raises(AuthenticationFailed):
        _authenticate(raw_key)


def test_unknown_keys_are_not_cached(settings, django_assert_num_queries):
    settings.API_KEY_CACHE_SECONDS = 60
    for _ in range(2):
        with django_assert_num_queries(1), pytest.raises(AuthenticationFailed):
            _authenticate("fm_unknown")


# The throttle's batches ---------------------------------------------------------------------------


@pytest.fixture
def throttle_at(monkeypatch):
    """A throttle of `rate` on a clock stopped 10 s into a window, and a request of a key."""
    from ferrum_memory.core.throttling import ApiKeyRateThrottle

    def make(rate: str) -> tuple[Callable[[], bool], ApiKey]:
        monkeypatch.setattr(ApiKeyRateThrottle, "THROTTLE_RATES", {"api_key": rate})
        monkeypatch.setattr(ApiKeyRateThrottle, "timer", lambda self: 60.0 * 1000 + 10.0)
        api_key, _ = api_key_create(name="batched")
        request = SimpleNamespace(auth=api_key)
        return lambda: ApiKeyRateThrottle().allow_request(request, None), api_key  # type: ignore[arg-type]

    return make


def test_throttle_adds_a_large_budget_to_the_shared_counter_in_batches(throttle_at):
    allow, api_key = throttle_at("1000/min")  # batches of 10
    counter = f"throttle_api_key_{api_key.pk}:1000"
    assert all(allow() for _ in range(9))
    assert cache.get(counter) is None
    assert allow()
    assert cache.get(counter) == 10
    # In one process the budget is exact: the 1,001st request of the window is refused.
    assert all(allow() for _ in range(990))
    assert not allow()


def test_throttle_sees_the_other_processes_within_one_batch(throttle_at):
    allow, api_key = throttle_at("1000/min")
    cache.set(f"throttle_api_key_{api_key.pk}:1000", 1000)  # other processes spent it all
    answers = [allow() for _ in range(30)]
    assert answers == [True] * 9 + [False] * 21  # at most one batch (1%) beyond the budget
