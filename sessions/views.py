from uuid import UUID

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ferrum_memory.core.permissions import allowed_agent_ids, ensure_agent_allowed

from . import serializers as s
from .selectors import session_state_get
from .services import session_close, session_compress, session_start, session_update

INVALID = OpenApiResponse(description="Invalid input or over-size state, with errors per field.")
NOT_FOUND = OpenApiResponse(description="No such session, or one of an agent this key may not use.")
GONE = OpenApiResponse(description="The session is closed or expired; the body says when.")
DOWN = OpenApiResponse(description="The working-memory store (Redis) does not answer.")


class SessionStartView(APIView):
    @extend_schema(
        request=s.SessionStartSerializer,
        responses={201: s.WorkingMemoryStateSerializer, 400: INVALID, 503: DOWN},
    )
    def post(self, request: Request) -> Response:
        body = s.SessionStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        ensure_agent_allowed(request, data["agent_id"])
        _, state = session_start(
            agent_id=data.pop("agent_id"),
            ttl_seconds=data.pop("ttl_seconds", None),
            messages=data.pop("messages", []),
            fields=data,
        )
        return Response(s.WorkingMemoryStateSerializer(state).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    @extend_schema(
        responses={200: s.WorkingMemoryStateSerializer, 404: NOT_FOUND, 410: GONE, 503: DOWN}
    )
    def get(self, request: Request, session_id: UUID) -> Response:
        _, state = session_state_get(session_id=session_id, agent_ids=allowed_agent_ids(request))
        return Response(s.WorkingMemoryStateSerializer(state).data)

    @extend_schema(
        request=s.SessionUpdateSerializer,
        responses={
            200: s.WorkingMemoryStateSerializer,
            400: INVALID,
            404: NOT_FOUND,
            409: OpenApiResponse(
                description="A stale version; `current_version` is the stored one."
            ),
            410: GONE,
            503: DOWN,
        },
    )
    def put(self, request: Request, session_id: UUID) -> Response:
        body = s.SessionUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        state = session_update(
            session_id=session_id,
            version=body.validated_data["version"],
            fields=body.fields_to_set(),
            append_messages=body.validated_data.get("append_messages", []),
            agent_ids=allowed_agent_ids(request),
        )
        return Response(s.WorkingMemoryStateSerializer(state).data)


class SessionCloseView(APIView):
    @extend_schema(
        request=s.SessionIdSerializer,
        responses={
            202: s.ConsolidationSerializer,
            400: INVALID,
            404: NOT_FOUND,
            410: GONE,
            503: DOWN,
        },
    )
    def post(self, request: Request) -> Response:
        body = s.SessionIdSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        consolidation = session_close(
            session_id=body.validated_data["session_id"], agent_ids=allowed_agent_ids(request)
        )
        return Response(
            s.ConsolidationSerializer(consolidation).data, status=status.HTTP_202_ACCEPTED
        )


class MemoryCompressView(APIView):
    @extend_schema(
        request=None,
        parameters=[OpenApiParameter("session_id", UUID, required=True)],
        responses={
            201: s.ConsolidationSerializer,
            200: OpenApiResponse(
                s.ConsolidationSerializer,
                description="This state was consolidated before: nothing new was stored.",
            ),
            202: OpenApiResponse(
                s.ConsolidationSerializer, description="Another run is consolidating it now."
            ),
            400: INVALID,
            404: NOT_FOUND,
            410: GONE,
            503: DOWN,
        },
    )
    def post(self, request: Request) -> Response:
        query = s.SessionIdSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        consolidation, created = session_compress(
            session_id=query.validated_data["session_id"], agent_ids=allowed_agent_ids(request)
        )
        code = (
            status.HTTP_202_ACCEPTED
            if consolidation.status != consolidation.Status.DONE
            else status.HTTP_201_CREATED
            if created
            else status.HTTP_200_OK
        )
        return Response(s.ConsolidationSerializer(consolidation).data, status=code)
