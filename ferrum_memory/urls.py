from typing import Any

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from ferrum_memory.core.views import HealthView, MetricsView, StatsView

handler400 = "ferrum_memory.core.exceptions.json_bad_request"
handler403 = "ferrum_memory.core.exceptions.json_permission_denied"
handler404 = "ferrum_memory.core.exceptions.json_not_found"
handler500 = "ferrum_memory.core.exceptions.json_server_error"

_public: dict[str, list[Any]] = {
    "authentication_classes": [],
    "permission_classes": [],
    "throttle_classes": [],
}

urlpatterns = [
    path("health", HealthView.as_view(), name="health"),
    path("stats", StatsView.as_view(), name="stats"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("openapi.json", SpectacularJSONAPIView.as_view(**_public), name="openapi"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi", **_public), name="docs"),
    path("admin/", admin.site.urls),
    path("", include("experience.urls")),
    path("", include("memory.urls")),
    path("", include("sessions.urls")),
    path("", include("agents.urls")),
]
