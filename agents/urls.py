from django.urls import path

from . import views

urlpatterns = [
    path("agents/<str:agent_id>", views.AgentView.as_view(), name="agent-detail"),
]
