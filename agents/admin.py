from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from ferrum_memory.core.permissions import admin_actor

from .models import AgentErasure
from .services import agent_erase


class EraseAgentForm(forms.ModelForm):
    class Meta:
        model = AgentErasure
        fields = ["agent_id"]
        help_texts = {
            "agent_id": "Everything of this agent is deleted: memories and their history, "
            "sessions, experiences, dream cycles. It cannot be undone."
        }


@admin.register(AgentErasure)
class AgentErasureAdmin(admin.ModelAdmin):
    """Erasure records, read-only; "Add" erases an agent, as DELETE /agents/{agent_id} does."""

    list_display = ("agent_id", "erased_at", "actor", "counts")
    search_fields = ("=agent_id",)
    readonly_fields = ("agent_id", "erased_at", "actor", "counts")

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = EraseAgentForm
        return super().get_form(request, obj, change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: AgentErasure, form: Any, change: bool) -> None:
        erasure = agent_erase(agent_id=obj.agent_id, actor=admin_actor(request))
        obj.pk = erasure.record.pk  # the record the service wrote; the admin saves nothing
        obj.erased_at = erasure.record.erased_at
        counts = ", ".join(f"{n} {kind}" for kind, n in erasure.record.counts.items() if n)
        self.message_user(
            request,
            f"Erased agent {obj.agent_id}: {counts or 'nothing was left'}.",
            messages.SUCCESS,
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
