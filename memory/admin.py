import json

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ferrum_memory.core.permissions import admin_actor

from .models import MemoryEvent, MemoryItem
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
    exclude = ("embedding", "sentence_embeddings", "token_embeddings")
    readonly_fields = ("history",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # memories are embedded by the API, never typed in here

    def has_change_permission(self, request: HttpRequest, obj: MemoryItem | None = None) -> bool:
        return False  # an edit would bypass the revision the vector index follows

    def delete_model(self, request: HttpRequest, obj: MemoryItem) -> None:
        memory_delete_many(
            queryset=MemoryItem.objects.filter(pk=obj.pk), actor=admin_actor(request)
        )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[MemoryItem]) -> None:
        memory_delete_many(queryset=queryset, actor=admin_actor(request))

    @admin.display(description="History")
    def history(self, obj: MemoryItem) -> SafeString:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            (
                (e.at, e.kind, e.actor, e.version, json.dumps(e.changes, ensure_ascii=False))
                for e in MemoryEvent.objects.filter(point_id=obj.pk).order_by("id")
            ),
        )
        head = "<tr><th>at</th><th>event</th><th>by</th><th>version</th><th>changes</th></tr>"
        return format_html("<table>{}{}</table>", SafeString(head), rows)


@admin.register(MemoryEvent)
class MemoryEventAdmin(admin.ModelAdmin):
    """Histories, read-only: they record what happened."""

    list_display = ("point_id", "agent_id", "kind", "actor", "version", "at")
    list_filter = ("kind",)
    search_fields = ("=point_id", "=agent_id")
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: MemoryEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: MemoryEvent | None = None) -> bool:
        return False
