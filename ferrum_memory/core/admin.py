from typing import Any

from django.contrib import admin, messages
from django.forms import ModelForm
from django.http import HttpRequest

from .models import ApiKey
from .services import api_key_create


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "prefix",
        "read_only",
        "allowed_agent_ids",
        "is_active",
        "created_at",
        "last_used_at",
    )
    list_filter = ("is_active", "read_only")
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: ModelForm, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new key is made by the service, which generates it; its raw value is shown once.
        created, raw_key = api_key_create(
            name=obj.name, allowed_agent_ids=obj.allowed_agent_ids or [], read_only=obj.read_only
        )
        obj.pk = created.pk
        self.message_user(
            request,
            f"API key created. Copy it now, it will not be shown again: {raw_key}",
            messages.WARNING,
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self.readonly_fields
