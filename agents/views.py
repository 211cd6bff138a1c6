from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ferrum_memory.core.permissions import actor_name, ensure_agent_allowed

from . import serializers as s
from .services import agent_erase

AGENT_ID = OpenApiParameter("agent_id", {"type": "string", "maxLength": 256}, OpenApiParameter.PATH)


class AgentView(APIView):
    @extend_schema(
        operation_id="agent_erase",
        parameters=[AGENT_ID],
        responses={
            200: s.AgentErasureSerializer,
            400: OpenApiResponse(description="agent_id is over 256 characters."),
            503: OpenApiResponse(description="Working memory (Redis) is down: retry later."),
        },
    )
    def delete(self, request: Request, agent_id: str) -> Response:
        path = s.AgentPathSerializer(data={"agent_id": agent_id})
        path.is_valid(raise_exception=True)
        ensure_agent_allowed(request, agent_id)
        erasure = agent_erase(agent_id=agent_id, actor=actor_name(request))
        return Response(s.AgentErasureSerializer(erasure).data)
