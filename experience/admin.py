import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.forms import Form, ModelForm
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from .dashboard import dashboard_context
from .dream_services import dream_cycle_delete_many, dream_cycle_release
from .models import DreamCycle, DreamCycleItem, Experience, ReplaySettings, ReplayState
from .replay_selectors import SETTING_NAMES, replay_defaults
from .replay_services import replay_settings_put, replay_state_recount
from .services import (
    experience_curate,
    experience_delete_many,
    experience_recompute_priority,
    experience_reset_priority_to_max,
)

TASK_EXCERPT_CHARS = 80
# The curated fields, with the names the admin's log gives them.
CURATED_FIELDS = {"td_error": "TD error", "priority": "priority"}
Curated = dict[str, float | None]  # one experience's curated fields, by name


def curation_message(how: str, before: Curated, after: Curated) -> str:
    """The admin log's change message: each curated field that changed, before and after
    (exact values: the shortest text that reads back as the same float), or "" if none did."""
    changes = [
        f"{label} from {before[name]!r} to {after[name]!r}"
        for name, label in CURATED_FIELDS.items()
        if before[name] != after[name]
    ]
    return f"{how}: {', '.join(changes)}." if changes else ""


class RewardSignFilter(admin.SimpleListFilter):
    title = "reward"
    parameter_name = "reward_sign"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("positive", "> 0"), ("zero", "= 0"), ("negative", "< 0")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[Experience]
    ) -> QuerySet[Experience]:
        lookup = {"positive": "reward__gt", "zero": "reward", "negative": "reward__lt"}.get(
            self.value() or ""
        )
        return queryset.filter(**{lookup: 0}) if lookup else queryset


class SampledFilter(admin.SimpleListFilter):
    title = "sampled"
    parameter_name = "sampled"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Sampled"), ("no", "Never sampled")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[Experience]
    ) -> QuerySet[Experience]:
        if self.value() == "yes":
            return queryset.filter(times_sampled__gt=0)
        if self.value() == "no":
            return queryset.filter(times_sampled=0)
        return queryset


class RetiredFilter(admin.SimpleListFilter):
    title = "retired"
    parameter_name = "retired"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Retired by the sampling cap"), ("no", "Sampleable")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[Experience]
    ) -> QuerySet[Experience]:
        if self.value() in ("yes", "no"):
            return queryset.filter(retired_at__isnull=self.value() == "no")
        return queryset


def _pretty(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


@admin.register(Experience)
class ExperienceAdmin(admin.ModelAdmin):
    """Curation: every edit goes through the services, so replay sees it on the next request."""

    list_display = (
        "experience_id",
        "agent_id",
        "task_excerpt",
        "reward",
        "passed",
        "td_error",
        "priority",
        "times_sampled",
        "retired_at",
        "created_at",
    )
    list_editable = ("td_error", "priority")
    list_filter = ("agent_id", "passed", RewardSignFilter, SampledFilter, RetiredFilter)
    search_fields = ("task", "experience_id")
    ordering = ("-id",)
    show_full_result_count = False  # COUNT(*) over a million rows on every page is slow
    list_per_page = 50
    actions = ("reset_priority_to_max", "recompute_priority", "delete_selected_experiences")
    fields = (
        "experience_id",
        "agent_id",
        "session_id",
        "task",
        "tool_calls_pretty",
        "test_result_pretty",
        "reward",
        "td_error",
        "priority",
        "metadata_pretty",
        "created_at",
        "expires_at",
        "times_sampled",
        "last_sampled_at",
        "retired_at",
    )
    readonly_fields = tuple(f for f in fields if f not in {"td_error", "priority"})

    @admin.display(description="task")
    def task_excerpt(self, obj: Experience) -> str:
        return (
            obj.task if len(obj.task) <= TASK_EXCERPT_CHARS else obj.task[:TASK_EXCERPT_CHARS] + "…"
        )

    @admin.display(description="tool calls")
    def tool_calls_pretty(self, obj: Experience) -> str:
        return _pretty(obj.tool_calls)

    @admin.display(description="test result")
    def test_result_pretty(self, obj: Experience) -> str:
        return _pretty(obj.test_result)

    @admin.display(description="metadata")
    def metadata_pretty(self, obj: Experience) -> str:
        return _pretty(obj.metadata)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # experiences come from agents through the API or import_experiences

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # replaced by one that leaves tombstones
        return actions

    def save_model(
        self, request: HttpRequest, obj: Experience, form: ModelForm, change: bool
    ) -> None:
        experience_curate(
            experience=obj,
            td_error=form.cleaned_data.get("td_error"),
            priority=form.cleaned_data.get("priority") if "priority" in form.changed_data else None,
        )

    def construct_change_message(  # type: ignore[override]
        self,
        request: HttpRequest,
        form: Form,
        formsets: Any,
        add: bool = False,
    ) -> str | list[dict[str, dict[str, list[str]]]]:
        """The change form and the list's editable columns log this, after save_model and in its
        transaction: the form's initial values before, the saved instance after (the service
        may set the priority a TD error implies). A text message, which LogEntry keeps as given
        (the stub types only Django's structured list)."""
        assert isinstance(form, ModelForm)
        message = curation_message(
            "Changed",
            {name: form.initial.get(name) for name in CURATED_FIELDS},
            {name: getattr(form.instance, name) for name in CURATED_FIELDS},
        )
        return message or super().construct_change_message(request, form, formsets, add)

    def _curate_logged(
        self,
        request: HttpRequest,
        queryset: QuerySet[Experience],
        how: str,
        service: Callable[..., int],
    ) -> int:
        """Run a bulk curation service and log each experience it changed, with the user, in one
        transaction; the rows are locked first (PostgreSQL; SQLite's IMMEDIATE transaction holds
        the write lock) so that "before" is what the service changed."""
        fields = ("pk", "experience_id", *CURATED_FIELDS)

        def read(rows: QuerySet[Experience]) -> dict[int, tuple[Any, ...]]:
            return {row[0]: row for row in rows.values_list(*fields)}

        user_id = request.user.pk
        assert user_id is not None  # the admin's views need a logged-in user
        with transaction.atomic():
            # A subquery, not a list of ids: "select all" may pick more rows than SQLite takes
            # parameters.
            selected = Experience.objects.filter(pk__in=queryset.values("pk"))
            before = read(selected.select_for_update())
            count = service(queryset=selected)
            content_type = ContentType.objects.get_for_model(Experience)
            entries = []
            for pk, row in read(selected).items():
                message = curation_message(
                    how,
                    dict(zip(CURATED_FIELDS, before[pk][2:], strict=True)),
                    dict(zip(CURATED_FIELDS, row[2:], strict=True)),
                )
                if message:
                    entries.append(
                        LogEntry(
                            user_id=user_id,
                            content_type=content_type,
                            object_id=str(pk),
                            object_repr=row[1][:200],
                            action_flag=CHANGE,
                            change_message=message,
                        )
                    )
            LogEntry.objects.bulk_create(entries, batch_size=1000)
        return count

    def delete_model(self, request: HttpRequest, obj: Experience) -> None:
        experience_delete_many(queryset=Experience.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Experience]) -> None:
        experience_delete_many(queryset=queryset)

    @admin.action(description="Reset priority to the agent's max")
    def reset_priority_to_max(self, request: HttpRequest, queryset: QuerySet[Experience]) -> None:
        count = self._curate_logged(
            request, queryset, "Reset priority to the agent's max", experience_reset_priority_to_max
        )
        self.message_user(request, f"{count} experiences now have their agent's max priority.")

    @admin.action(description="Recompute priority from the TD error")
    def recompute_priority(self, request: HttpRequest, queryset: QuerySet[Experience]) -> None:
        count = self._curate_logged(
            request,
            queryset,
            "Recomputed priority from the TD error",
            experience_recompute_priority,
        )
        self.message_user(
            request, f"Recomputed the priority of {count} experiences with a TD error."
        )

    @admin.action(description="Delete selected experiences")
    def delete_selected_experiences(
        self, request: HttpRequest, queryset: QuerySet[Experience]
    ) -> None:
        with transaction.atomic():  # logged as Django's own "delete selected" logs
            self.log_deletions(request, queryset)
            count = experience_delete_many(queryset=queryset)
        self.message_user(request, f"Deleted {count} experiences.", messages.SUCCESS)


class DreamCycleItemInline(admin.TabularInline):
    model = DreamCycleItem
    fields = (
        "position",
        "experience_id",
        "probability",
        "weight",
        "td_error_before",
        "td_error_after",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(DreamCycle)
class DreamCycleAdmin(admin.ModelAdmin):
    """Cycles are made by the beat and completed by learners: shown, released or deleted here.

    The replay dashboard hangs off this page (dashboard/), linked from its object tools."""

    list_display = (
        "id",
        "agent_id",
        "number",
        "status",
        "strategy",
        "beta",
        "buffer_size",
        "created_at",
        "claimed_by",
        "lease_until",
        "completed_at",
    )
    list_filter = ("status", "strategy", "agent_id")
    search_fields = ("agent_id", "claimed_by")
    ordering = ("-id",)
    show_full_result_count = False
    inlines = (DreamCycleItemInline,)
    # Django's "delete selected" stays: it confirms, then calls delete_queryset (the service).
    actions = ("release_lease",)
    exclude = ("lease_token",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # cycles come from the beat or `manage.py dream`

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a recorded draw is history; the view permission shows it read-only

    def delete_model(self, request: HttpRequest, obj: DreamCycle) -> None:
        dream_cycle_delete_many(queryset=DreamCycle.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[DreamCycle]) -> None:
        dream_cycle_delete_many(queryset=queryset)

    def has_release_permission(self, request: HttpRequest) -> bool:
        # The form stays read-only for everyone; releasing a lease needs the change permission.
        return request.user.has_perm("experience.change_dreamcycle")

    @admin.action(
        description="Release the lease (the next claim takes the cycle)", permissions=["release"]
    )
    def release_lease(self, request: HttpRequest, queryset: QuerySet[DreamCycle]) -> None:
        count = dream_cycle_release(queryset=queryset)
        self.message_user(request, f"Released {count} claimed cycles.")

    def get_urls(self) -> list[URLPattern]:
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name="experience_replay_dashboard",
        )
        return [dashboard, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        agent_id = request.GET.get("agent_id") or None
        return TemplateResponse(
            request,
            "admin/experience/replay_dashboard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Replay dashboard" + (f": {agent_id}" if agent_id else ""),
                "opts": self.model._meta,
                "agent_id": agent_id or "",
                **dashboard_context(agent_id=agent_id),
            },
        )


@admin.register(ReplaySettings)
class ReplaySettingsAdmin(admin.ModelAdmin):
    """One agent's replay controls; an agent without a row has the REPLAY_* defaults (a new row
    starts from them). Saved through the service, as PUT /experience/settings saves them."""

    list_display = ("agent_id", *SETTING_NAMES, "updated_at")
    list_filter = ("remover",)
    search_fields = ("agent_id",)
    ordering = ("agent_id",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("agent_id",) if obj is not None else ()

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {**replay_defaults(), **super().get_changeform_initial_data(request)}

    def save_model(
        self, request: HttpRequest, obj: ReplaySettings, form: ModelForm, change: bool
    ) -> None:
        replay_settings_put(
            agent_id=obj.agent_id, values={name: getattr(obj, name) for name in SETTING_NAMES}
        )


@admin.register(ReplayState)
class ReplayStateAdmin(admin.ModelAdmin):
    """Each agent's replay counters, kept by the writes themselves: shown, and recounted from
    the rows on demand (after rows were loaded around the service, as the bench loads them)."""

    list_display = ("agent_id", "size", "inserts", "samples", "removals", "retired")
    search_fields = ("agent_id",)
    ordering = ("-size",)
    actions = ("recount",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_recount_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("experience.change_replaystate")

    @admin.action(description="Recount the size from the stored rows", permissions=["recount"])
    def recount(self, request: HttpRequest, queryset: QuerySet[ReplayState]) -> None:
        count = replay_state_recount(agent_ids=list(queryset.values_list("agent_id", flat=True)))
        self.message_user(request, f"Recounted {count} agents.")
