import dataclasses
import uuid
from typing import Any

import orjson
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder
from rest_framework.views import APIView

from ferrum_memory.core.permissions import allowed_agent_ids, ensure_agent_allowed
from ferrum_memory.core.renderers import OrjsonRenderer
from ferrum_memory.core.schema import paginated
from ferrum_memory.core.validation import one_or_many_schema, validate_one_or_many

from . import serializers as s
from .replay_selectors import ReplayControls, replay_controls_get
from .replay_services import replay_draw, replay_limiter_status, replay_settings_put
from .selectors import (
    experience_get,
    experience_list,
    experience_stats,
    parse_stored_json,
)
from .services import (
    experience_create_many,
    experience_delete_many,
    experience_td_error_update,
)

ExperienceCreateRequest = one_or_many_schema(
    s.ExperienceInSerializer, max_items=s.MAX_BATCH, component_name="ExperienceCreate"
)
TdErrorRequest = PolymorphicProxySerializer(
    component_name="TdErrorRequest",
    serializers=[s.TdErrorUpdateSerializer, s.TdErrorBatchSerializer],
    resource_type_field_name=None,
    many=False,
)
ERRORS = {400: OpenApiResponse(description="Invalid input, with errors per field.")}


class ExperiencePagination(CursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class ExperienceCollectionView(APIView):
    @extend_schema(
        operation_id="experience_list",
        parameters=[s.ExperienceListQuerySerializer],
        responses={200: paginated(s.ExperienceOutSerializer)},
    )
    def get(self, request: Request) -> Response:
        query = s.ExperienceListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        paginator = ExperiencePagination()
        page = paginator.paginate_queryset(
            experience_list(agent_ids=allowed_agent_ids(request), filters=query.validated_data),
            request,
            view=self,
        )
        return paginator.get_paginated_response(s.ExperienceOutSerializer(page, many=True).data)

    @extend_schema(
        request=ExperienceCreateRequest,
        responses={
            201: PolymorphicProxySerializer(
                component_name="ExperienceCreated",
                serializers=[s.ExperienceOutSerializer, s.ExperienceBatchOutSerializer],
                resource_type_field_name=None,
                many=False,
            ),
            200: OpenApiResponse(
                description="Every id was stored before: the stored row (one), or the counts "
                "and ids (a list)."
            ),
            409: OpenApiResponse(description="An id is used by another agent."),
            **ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        items, many = validate_one_or_many(
            s.ExperienceInSerializer, request.data, max_items=s.MAX_BATCH, noun="experiences"
        )
        for item in items:
            ensure_agent_allowed(request, item["agent_id"])
            item["experience_id"] = item.pop("id", None) or uuid.uuid4().hex
        stored = experience_create_many(items=items)
        created = sum(result.created for result in stored)
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        if not many:
            return Response(s.ExperienceOutSerializer(stored[0].experience).data, status=code)
        # A list gets ids, not its rows back: echoing 1,000 rows cost more than storing them.
        body = {
            "created": created,
            "existing": len(stored) - created,
            "items": [{"id": r.experience.experience_id, "created": r.created} for r in stored],
        }
        return Response(s.ExperienceBatchOutSerializer(body).data, status=code)


EXPERIENCE_ID = OpenApiParameter(
    "experience_id", {"type": "string", "maxLength": 256}, OpenApiParameter.PATH
)


class ExperienceDetailView(APIView):
    @extend_schema(
        parameters=[EXPERIENCE_ID],
        responses={200: s.ExperienceOutSerializer, 404: OpenApiResponse()},
    )
    def get(self, request: Request, experience_id: str) -> Response:
        experience = experience_get(
            experience_id=experience_id, agent_ids=allowed_agent_ids(request)
        )
        return Response(s.ExperienceOutSerializer(experience).data)

    @extend_schema(parameters=[EXPERIENCE_ID], responses={204: None, 404: OpenApiResponse()})
    def delete(self, request: Request, experience_id: str) -> Response:
        experience = experience_get(
            experience_id=experience_id, agent_ids=allowed_agent_ids(request)
        )
        experience_delete_many(queryset=type(experience).objects.filter(pk=experience.pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ExperienceStatsView(APIView):
    @extend_schema(responses={200: dict[str, Any]})
    def get(self, request: Request) -> Response:
        return Response(experience_stats(agent_ids=allowed_agent_ids(request)))


class TdErrorView(APIView):
    @extend_schema(
        request=TdErrorRequest,
        responses={200: s.TdErrorResultSerializer, **ERRORS},
    )
    def put(self, request: Request) -> Response:
        data = request.data
        batch = isinstance(data, dict) and "updates" in data
        if batch and isinstance(data["updates"], list):  # type: ignore[call-overload]
            if len(data["updates"]) > s.MAX_TD_UPDATES:  # type: ignore[call-overload]
                raise ValidationError({"updates": [f"At most {s.MAX_TD_UPDATES} updates."]})
        serializer = (s.TdErrorBatchSerializer if batch else s.TdErrorUpdateSerializer)(
            data=request.data
        )
        serializer.is_valid(raise_exception=True)
        updates = serializer.validated_data["updates"] if batch else [serializer.validated_data]
        result = experience_td_error_update(
            updates=[(u["experience_id"], u["td_error"]) for u in updates],
            agent_ids=allowed_agent_ids(request),
        )
        # An unknown id is reported, one or many alike: the target of the PUT is this endpoint,
        # which exists, so a 404 would say the wrong thing (and clients read one answer shape).
        return Response(s.TdErrorResultSerializer(result).data)


class StoredJsonEncoder(JSONEncoder):
    """DRF's encoder, which the renderer uses to indent: it writes stored JSON too."""

    def default(self, obj: Any) -> Any:
        if isinstance(obj, orjson.Fragment):
            return parse_stored_json(obj)
        return super().default(obj)


class ReplayRenderer(OrjsonRenderer):
    """Replay items carry their JSON columns as stored (orjson.Fragment, see ExperienceRow)."""

    encoder_class = StoredJsonEncoder


class ReplayView(APIView):
    renderer_classes = [ReplayRenderer]

    @extend_schema(
        parameters=[s.ReplayQuerySerializer],
        responses={
            200: s.ReplayOutSerializer,
            409: OpenApiResponse(description="The buffer holds fewer than min_size experiences."),
            429: OpenApiResponse(
                s.ReplayRateLimitedSerializer,
                description="The agent's rate limiter grants no such draw now (or the key's "
                "throttle): retry after Retry-After seconds, or pass wait_ms.",
            ),
            **ERRORS,
        },
    )
    def get(self, request: Request) -> Response:
        query = s.ReplayQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = dict(query.validated_data)
        allowed = allowed_agent_ids(request)
        if params.get("agent_id"):
            ensure_agent_allowed(request, params["agent_id"])
        elif allowed is not None:
            if len(allowed) != 1:
                raise ValidationError(
                    {"agent_id": ["Required: this key is limited to several agents."]}
                )
            params["agent_id"] = allowed[0]
        params.setdefault("agent_id", None)
        batch = replay_draw(**params)
        return Response(s.ReplayOutSerializer(batch).data)


def _settings_body(controls: ReplayControls) -> dict[str, Any]:
    return {
        **dataclasses.asdict(controls),
        "limiter": dataclasses.asdict(replay_limiter_status(controls=controls)),
    }


class ReplaySettingsView(APIView):
    """One agent's replay controls: capacity, remover, sampling cap, rate limiter, alpha."""

    @extend_schema(
        operation_id="experience_settings_get",
        parameters=[s.ReplaySettingsQuerySerializer],
        responses={200: s.ReplaySettingsOutSerializer},
    )
    def get(self, request: Request) -> Response:
        query = s.ReplaySettingsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        ensure_agent_allowed(request, query.validated_data["agent_id"])
        controls = replay_controls_get(agent_id=query.validated_data["agent_id"])
        return Response(s.ReplaySettingsOutSerializer(_settings_body(controls)).data)

    @extend_schema(
        operation_id="experience_settings_put",
        request=s.ReplaySettingsInSerializer,
        responses={
            200: s.ReplaySettingsOutSerializer,
            403: OpenApiResponse(description="Only a key not limited to agents may set them."),
            **ERRORS,
        },
    )
    def put(self, request: Request) -> Response:
        body = s.ReplaySettingsInSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if allowed_agent_ids(request) is not None:
            raise PermissionDenied("Only a key that is not limited to agents may set them.")
        values = dict(body.validated_data)
        controls = replay_settings_put(agent_id=values.pop("agent_id"), values=values)
        return Response(s.ReplaySettingsOutSerializer(_settings_body(controls)).data)
