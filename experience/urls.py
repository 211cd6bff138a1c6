from django.urls import path, re_path

from . import views

urlpatterns = [
    # The spec writes /experience/; /experience is accepted too, as a POST cannot be redirected.
    re_path(r"^experience/?$", views.ExperienceCollectionView.as_view(), name="experience-list"),
    path("experience/stats", views.ExperienceStatsView.as_view(), name="experience-stats"),
    path("experience/td-error", views.TdErrorView.as_view(), name="experience-td-error"),
    path("experience/replay", views.ReplayView.as_view(), name="experience-replay"),
    path(
        "experience/<str:experience_id>",
        views.ExperienceDetailView.as_view(),
        name="experience-detail",
    ),
]
