"""The browser middleware runs for the admin only; the API's answers and headers are as before."""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_api_requests_skip_sessions_the_user_and_messages(api_client):
    response = api_client.get("/stats")
    assert response.status_code == 200
    request = response.wsgi_request
    assert not hasattr(request, "session")
    assert not hasattr(request, "_messages")
    # The user DRF authenticated is the API key, as before; Django's own is never made.
    assert request.user.is_authenticated and request.user == request.auth
    assert "Cookie" not in response.get("Vary", "")
    assert not response.cookies


def test_api_answers_keep_their_security_headers(api_client):
    response = api_client.get(f"/memory/{'0' * 8}-0000-0000-0000-{'0' * 12}")
    assert response.status_code == 404
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Request-ID"]


def test_the_admin_still_has_sessions_login_and_csrf(django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    browser = Client(enforce_csrf_checks=True)
    login = browser.get("/admin/login/")
    assert login.status_code == 200 and "csrftoken" in login.cookies
    # Without the token the login is refused: CSRF's view check runs for the admin.
    refused = browser.post("/admin/login/", {"username": "root", "password": "pw"})
    assert refused.status_code == 403
    token = login.cookies["csrftoken"].value
    logged_in = browser.post(
        "/admin/login/?next=/admin/",
        {"username": "root", "password": "pw", "csrfmiddlewaretoken": token},
    )
    assert logged_in.status_code == 302 and "sessionid" in logged_in.cookies
    page = browser.get("/admin/")
    assert page.status_code == 200 and page.wsgi_request.user.username == "root"
