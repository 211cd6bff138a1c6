from django.urls import path

from . import views

urlpatterns = [
    path("memory/", views.MemoryCollectionView.as_view(), name="memory-list"),
    path("memory/store", views.MemoryStoreView.as_view(), name="memory-store"),
    path("memory/context", views.MemoryContextView.as_view(), name="memory-context"),
    path("memory/search", views.MemorySearchView.as_view(), name="memory-search"),
    path("memory/<uuid:point_id>", views.MemoryDetailView.as_view(), name="memory-detail"),
    path(
        "memory/<uuid:point_id>/history",
        views.MemoryHistoryView.as_view(),
        name="memory-history",
    ),
]
