from django.urls import path

from . import views

urlpatterns = [
    path("agents/<str:agent_id>", views.AgentView.as_view(), name="agent-detail"),
    path("agents/<str:agent_id>/export", views.AgentExportView.as_view(), name="agent-export"),
    path("agents/<str:agent_id>/import", views.AgentImportView.as_view(), name="agent-import"),
]
