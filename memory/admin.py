from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import MemoryItem
from .services import memory_delete_many


@admin.register(MemoryItem)
class MemoryItemAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "agent_id",
        "kind",
        "source",
        "importance",
        "sensitivity",
        "access_count",
        "created_at",
    )
    list_filter = ("kind", "source", "sensitivity", "agent_id")
    search_fields = ("content",)
    show_full_result_count = False
    exclude = ("embedding",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # memories are embedded by the API, never typed in here

    def has_change_permission(self, request: HttpRequest, obj: MemoryItem | None = None) -> bool:
        return False  # an edit would bypass the revision the vector index follows

    def delete_model(self, request: HttpRequest, obj: MemoryItem) -> None:
        memory_delete_many(queryset=MemoryItem.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[MemoryItem]) -> None:
        memory_delete_many(queryset=queryset)
