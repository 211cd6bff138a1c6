import json
import re

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from ferrum_memory.core.models import ApiKey

pytestmark = pytest.mark.django_db


def test_health_is_public_and_reports_each_backend(anon_client):
    response = anon_client.get("/health")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ok" and body["failed"] == []
    assert body["backends"]["database"] == {"status": "ok", "engine": connection.vendor}
    assert body["backends"]["broker"]["status"] == "ok"


def test_health_is_503_naming_the_broker_when_it_is_down(anon_client, settings):
    from ferrum_memory.celery import app

    # Port 1 on loopback: nothing listens there, so the connection is refused at once.
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    try:
        response = anon_client.get("/health")
    finally:
        app.conf.broker_url = settings.CELERY_BROKER_URL
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["broker"]
    assert body["backends"]["broker"]["status"] == "error"
    assert body["backends"]["database"]["status"] == "ok"


def test_sqlite_runs_in_wal_mode():
    if connection.vendor != "sqlite":
        pytest.skip("WAL is SQLite's; this run is on " + connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"


def test_sqlite_reads_through_a_memory_map(settings):
    if connection.vendor != "sqlite":
        pytest.skip("mmap_size is SQLite's; this run is on " + connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA mmap_size")
        # SQLite grants at most its compile-time cap (2 GiB less 64 KiB by default).
        assert 2**30 < cursor.fetchone()[0] <= settings.SQLITE_MMAP_SIZE


def test_stats_needs_a_key_and_reports_the_service(api_client):
    body = api_client.get("/stats").json()
    assert body["service"]["database"] == connection.vendor


def test_metrics_expose_prometheus_text(api_client, anon_client):
    assert anon_client.get("/metrics").status_code == 401
    api_client.get("/stats")
    response = api_client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    # One series per route, verb and status: the request above is counted.
    assert (
        b'ferrum_api_request_duration_seconds_count{method="GET",operation="stats",status="200"}'
        in response.content
    )


def test_openapi_schema_is_public_and_declares_bearer_auth(anon_client):
    response = anon_client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: `manage.py create_api_key`.",
    }
    assert "/health" in schema["paths"]


def test_schema_validates_without_warnings():
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_docs_are_served_offline(anon_client):
    response = anon_client.get("/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets, html
    assert not [a for a in assets if a.startswith(("http:", "https:", "//"))], assets
    script = next(a for a in assets if a.endswith(".js"))
    asset = anon_client.get(script)
    assert asset.status_code == 200, script


@pytest.mark.parametrize("path", ["/nope", "/nothing/here/either"])
def test_unknown_paths_get_json_404(anon_client, path):
    response = anon_client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


@pytest.mark.parametrize(
    ("handler", "status"),
    [("json_bad_request", 400), ("json_permission_denied", 403), ("json_server_error", 500)],
)
def test_django_error_handlers_answer_json(rf, handler, status):
    from ferrum_memory.core import exceptions

    response = getattr(exceptions, handler)(rf.get("/x"))
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert "detail" in json.loads(response.content)


def test_admin_needs_staff_login(client, django_user_model):
    assert client.get("/admin/").status_code == 302
    # force_login: django-axes (login limits) refuses client.login(), which has no request.
    client.force_login(django_user_model.objects.create_user("plain", password="pw"))
    assert client.get("/admin/").status_code == 302


def test_admin_creates_a_key_and_shows_it_once(admin_client):
    response = admin_client.post(
        "/admin/core/apikey/add/",
        {"name": "from-admin", "allowed_agent_ids": '["a"]', "is_active": "on"},
        follow=True,
    )
    assert response.status_code == 200
    api_key = ApiKey.objects.get(name="from-admin")
    shown = re.search(r"fm_[A-Za-z0-9_-]{43}", response.content.decode())
    assert shown, "the new key is shown to the admin"
    from ferrum_memory.core.services import api_key_hash

    assert api_key.key_hash == api_key_hash(shown.group(0))
    assert api_key.allowed_agent_ids == ["a"]
    response = admin_client.get(f"/admin/core/apikey/{api_key.pk}/change/")
    assert shown.group(0) not in response.content.decode()


def test_secret_key_is_not_a_built_in_default():
    key_file = settings.DATA_DIR / "secret_key"
    assert settings.SECRET_KEY == key_file.read_text().strip()
    assert len(settings.SECRET_KEY) >= 50


def test_admin_edits_an_existing_key_without_changing_its_hash(admin_client):
    from ferrum_memory.core.services import api_key_create

    api_key, _ = api_key_create(name="old")
    response = admin_client.post(
        f"/admin/core/apikey/{api_key.pk}/change/",
        {"name": "renamed", "allowed_agent_ids": "[]", "read_only": "on", "is_active": "on"},
    )
    assert response.status_code == 302
    edited = ApiKey.objects.get(pk=api_key.pk)
    assert (edited.name, edited.read_only, edited.key_hash) == ("renamed", True, api_key.key_hash)


def test_init_broker_declares_the_default_queue(capsys, settings):
    call_command("init_broker")
    assert "Broker ready" in capsys.readouterr().out
    if settings.CELERY_BROKER_URL.startswith("sqla+sqlite:///"):
        import sqlite3

        path = settings.CELERY_BROKER_URL.removeprefix("sqla+sqlite:///")
        with sqlite3.connect(path) as broker:
            names = [row[0] for row in broker.execute("SELECT name FROM kombu_queue")]
        assert "celery" in names
