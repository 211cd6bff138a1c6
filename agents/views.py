import re
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ferrum_memory.core.parsers import JsonLinesParser
from ferrum_memory.core.permissions import actor_name, ensure_agent_allowed

from . import serializers as s
from .selectors import agent_export
from .services import agent_erase, agent_import

AGENT_ID = OpenApiParameter("agent_id", {"type": "string", "maxLength": 256}, OpenApiParameter.PATH)
JSON_LINES = "application/x-ndjson"
SAFE_NAME = re.compile(r"[A-Za-z0-9._@:-]{1,256}")
BAD_AGENT_ID = {400: OpenApiResponse(description="agent_id is over 256 characters.")}


def _agent(request: Request, agent_id: str) -> str:
    path = s.AgentPathSerializer(data={"agent_id": agent_id})
    path.is_valid(raise_exception=True)
    ensure_agent_allowed(request, agent_id)
    return agent_id


class AgentView(APIView):
    @extend_schema(
        operation_id="agent_erase",
        parameters=[AGENT_ID],
        responses={
            200: s.AgentErasureSerializer,
            503: OpenApiResponse(description="Working memory (Redis) is down: retry later."),
            **BAD_AGENT_ID,
        },
    )
    def delete(self, request: Request, agent_id: str) -> Response:
        erasure = agent_erase(agent_id=_agent(request, agent_id), actor=actor_name(request))
        return Response(s.AgentErasureSerializer(erasure).data)


class JsonAnswers(BaseContentNegotiation):
    """The export streams JSON Lines whatever the Accept header says; its errors are JSON."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class AgentExportView(APIView):
    content_negotiation_class = JsonAnswers

    @extend_schema(
        operation_id="agent_export",
        parameters=[AGENT_ID],
        responses={
            (200, JSON_LINES): OpenApiResponse(
                OpenApiTypes.STR,
                description="JSON Lines: a header (format version, embedding model), memory "
                "items with embeddings, their history, experiences, open sessions, dream "
                "cycles, and an end line with the counts.",
            ),
            **BAD_AGENT_ID,
        },
    )
    def get(self, request: Request, agent_id: str) -> StreamingHttpResponse:
        lines = agent_export(agent_id=_agent(request, agent_id))
        response = StreamingHttpResponse(lines, content_type=JSON_LINES)
        # The agent id only where it is a safe file name: a header takes no control characters.
        name = agent_id if SAFE_NAME.fullmatch(agent_id) else "agent"
        response["Content-Disposition"] = f'attachment; filename="{name}.jsonl"'
        return response


class AgentImportView(APIView):
    parser_classes = [JsonLinesParser]

    @extend_schema(
        operation_id="agent_import",
        parameters=[AGENT_ID],
        request={JSON_LINES: OpenApiTypes.STR},
        responses={
            201: s.AgentImportSerializer,
            400: OpenApiResponse(
                description="A bad line (its number in `line`): nothing was imported."
            ),
            409: OpenApiResponse(description="An id of the file belongs to another agent."),
            415: OpenApiResponse(description="The body is not application/x-ndjson."),
            503: OpenApiResponse(description="Working memory (Redis) is down: retry later."),
        },
    )
    def post(self, request: Request, agent_id: str) -> Response:
        lines: list[bytes] = request.data  # type: ignore[assignment]  # JsonLinesParser's
        result = agent_import(agent_id=_agent(request, agent_id), lines=lines)
        return Response(s.AgentImportSerializer(result).data, status=status.HTTP_201_CREATED)
