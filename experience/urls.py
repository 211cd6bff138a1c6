from django.urls import path, re_path

from . import dream_views, views

urlpatterns = [
    # The spec writes /experience/; /experience is accepted too, as a POST cannot be redirected.
    re_path(r"^experience/?$", views.ExperienceCollectionView.as_view(), name="experience-list"),
    path("experience/stats", views.ExperienceStatsView.as_view(), name="experience-stats"),
    path("experience/td-error", views.TdErrorView.as_view(), name="experience-td-error"),
    path("experience/replay", views.ReplayView.as_view(), name="experience-replay"),
    path("experience/settings", views.ReplaySettingsView.as_view(), name="experience-settings"),
    path(
        "experience/<str:experience_id>",
        views.ExperienceDetailView.as_view(),
        name="experience-detail",
    ),
    # Dream cycles: the learner hand-off.
    re_path(r"^dream/cycles/?$", dream_views.DreamCycleListView.as_view(), name="dream-cycle-list"),
    path("dream/cycles/claim", dream_views.DreamCycleClaimView.as_view(), name="dream-cycle-claim"),
    path(
        "dream/cycles/<int:cycle_id>",
        dream_views.DreamCycleDetailView.as_view(),
        name="dream-cycle-detail",
    ),
    path(
        "dream/cycles/<int:cycle_id>/td-errors",
        dream_views.DreamCycleTdErrorsView.as_view(),
        name="dream-cycle-td-errors",
    ),
]
