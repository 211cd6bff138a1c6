from typing import TYPE_CHECKING

from django.http import HttpRequest
from rest_framework import exceptions, permissions
from rest_framework.request import Request

from .models import ApiKey

if TYPE_CHECKING:  # rest_framework.views imports the permission classes: no cycle at run time
    from rest_framework.views import APIView


class HasApiKey(permissions.BasePermission):
    """A valid key is required; a read-only key may only use safe methods, and the views that
    take their query as a POST body but only read (`reads_only = True`: search, context)."""

    message = "This API key is read-only."

    def has_permission(self, request: Request, view: "APIView") -> bool:
        api_key = request.auth
        if not isinstance(api_key, ApiKey):
            raise exceptions.NotAuthenticated(
                "An API key is required: 'Authorization: Bearer <key>'."
            )
        reads = request.method in permissions.SAFE_METHODS or getattr(view, "reads_only", False)
        return reads or not api_key.read_only


def allowed_agent_ids(request: Request) -> list[str] | None:
    """The agent ids the request's key may touch, or None when it may touch every agent."""
    api_key = request.auth
    if isinstance(api_key, ApiKey) and api_key.allowed_agent_ids:
        return list(api_key.allowed_agent_ids)
    return None


def ensure_agent_allowed(request: Request, agent_id: str) -> None:
    allowed = allowed_agent_ids(request)
    if allowed is not None and agent_id not in allowed:
        raise exceptions.PermissionDenied(f"This API key may not use agent '{agent_id}'.")


def actor_name(request: Request) -> str:
    """Who makes a change, for histories and erasure records: the API key's name."""
    api_key = request.auth
    return api_key.name if isinstance(api_key, ApiKey) else ""


def admin_actor(request: HttpRequest) -> str:
    """The admin user who makes a change, as histories and erasure records name them."""
    return f"admin:{request.user.get_username()}"
