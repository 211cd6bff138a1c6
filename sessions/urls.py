from django.urls import path

from . import views

urlpatterns = [
    path("session/start", views.SessionStartView.as_view(), name="session-start"),
    path("session/close", views.SessionCloseView.as_view(), name="session-close"),
    path("session/<uuid:session_id>", views.SessionDetailView.as_view(), name="session-detail"),
    # Not a UUID, so memory.urls' memory/<uuid:point_id> never takes it.
    path("memory/compress", views.MemoryCompressView.as_view(), name="memory-compress"),
]
