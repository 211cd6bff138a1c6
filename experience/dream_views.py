"""The learner hand-off: list dream cycles, claim one with a lease, report its TD errors."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ferrum_memory.core.models import ApiKey
from ferrum_memory.core.permissions import allowed_agent_ids, ensure_agent_allowed
from ferrum_memory.core.schema import paginated

from . import dream_serializers as s
from .dream_selectors import dream_cycle_experiences, dream_cycle_get, dream_cycle_list
from .dream_services import dream_cycle_claim, dream_cycle_complete
from .models import DreamCycle

NOT_FOUND = OpenApiResponse(description="No such cycle, or one of an agent this key may not use.")
INVALID = OpenApiResponse(description="Invalid input, with errors per field.")


class DreamCyclePagination(CursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def _detail(cycle: DreamCycle, serializer: type[s.DreamCycleDetailSerializer]) -> Response:
    context = {"experiences": dream_cycle_experiences(cycle=cycle)}
    return Response(serializer(cycle, context=context).data)


class DreamCycleListView(APIView):
    @extend_schema(
        operation_id="dream_cycles_list",
        parameters=[s.DreamCycleListQuerySerializer],
        responses={200: paginated(s.DreamCycleSerializer), 400: INVALID},
    )
    def get(self, request: Request) -> Response:
        query = s.DreamCycleListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        if query.validated_data.get("agent_id"):
            ensure_agent_allowed(request, query.validated_data["agent_id"])
        paginator = DreamCyclePagination()
        page = paginator.paginate_queryset(
            dream_cycle_list(agent_ids=allowed_agent_ids(request), **query.validated_data),
            request,
            view=self,
        )
        return paginator.get_paginated_response(s.DreamCycleSerializer(page, many=True).data)


class DreamCycleDetailView(APIView):
    @extend_schema(responses={200: s.DreamCycleDetailSerializer, 404: NOT_FOUND})
    def get(self, request: Request, cycle_id: int) -> Response:
        cycle = dream_cycle_get(cycle_id=cycle_id, agent_ids=allowed_agent_ids(request))
        return _detail(cycle, s.DreamCycleDetailSerializer)


class DreamCycleClaimView(APIView):
    @extend_schema(
        request=s.DreamClaimSerializer,
        responses={
            200: s.DreamCycleClaimedSerializer,
            204: OpenApiResponse(description="The agent has no cycle to claim."),
            400: INVALID,
        },
    )
    def post(self, request: Request) -> Response:
        body = s.DreamClaimSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        ensure_agent_allowed(request, body.validated_data["agent_id"])
        assert isinstance(request.auth, ApiKey)  # HasApiKey let the request in
        cycle = dream_cycle_claim(
            agent_id=body.validated_data["agent_id"],
            learner=body.validated_data.get("learner") or request.auth.name,
            lease_seconds=body.validated_data.get("lease_seconds"),
        )
        if cycle is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return _detail(cycle, s.DreamCycleClaimedSerializer)


class DreamCycleTdErrorsView(APIView):
    @extend_schema(
        request=s.DreamTdErrorReportSerializer,
        responses={
            200: s.DreamCompletionSerializer,
            400: INVALID,
            404: NOT_FOUND,
            409: OpenApiResponse(
                description="The lease was taken over, or the cycle is done; or the TD errors "
                "are not one for each experience of the cycle (`missing_ids`, `foreign_ids`)."
            ),
        },
    )
    def post(self, request: Request, cycle_id: int) -> Response:
        body = s.DreamTdErrorReportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reported = body.validated_data["td_errors"]
        completion = dream_cycle_complete(
            cycle_id=cycle_id,
            lease_token=body.validated_data["lease_token"],
            td_errors=[(u["experience_id"], u["td_error"]) for u in reported],
            agent_ids=allowed_agent_ids(request),
        )
        return Response(s.DreamCompletionSerializer(completion).data)
