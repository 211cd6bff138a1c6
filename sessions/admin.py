from django.contrib import admin

from .models import Consolidation, Session


class ConsolidationInline(admin.TabularInline):
    model = Consolidation
    fields = (
        "version",
        "status",
        "reason",
        "attempts",
        "summary_item",
        "created_at",
        "finished_at",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "agent_id",
        "status",
        "version",
        "consolidated_version",
        "started_at",
        "last_activity_at",
        "expires_at",
        "closed_at",
    ]
    list_filter = ["status"]
    search_fields = ["id", "agent_id"]
    raw_id_fields = ["summary_item"]
    readonly_fields = [f.name for f in Session._meta.fields]
    inlines = [ConsolidationInline]
    show_full_result_count = False
