from typing import Any
from uuid import UUID

from django.conf import settings
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ferrum_memory.core.permissions import actor_name, allowed_agent_ids, ensure_agent_allowed
from ferrum_memory.core.schema import paginated
from ferrum_memory.core.validation import one_or_many_schema, validate_one_or_many

from . import serializers as s
from .context import memory_context
from .selectors import memory_get, memory_history, memory_list, memory_search
from .services import memory_delete_many, memory_store_many, memory_update

ERRORS = {400: OpenApiResponse(description="Invalid input, with errors per field.")}


class MemoryPagination(CursorPagination):
    ordering: Any = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class MemoryHistoryPagination(CursorPagination):
    ordering = "id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 500


class MemoryCollectionView(APIView):
    @extend_schema(
        operation_id="memory_list",
        parameters=[s.MemoryListQuerySerializer],
        responses={200: paginated(s.MemoryOutSerializer)},
    )
    def get(self, request: Request) -> Response:
        query = s.MemoryListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        paginator = MemoryPagination()
        page = paginator.paginate_queryset(
            memory_list(agent_ids=allowed_agent_ids(request), filters=query.validated_data),
            request,
            view=self,
        )
        return paginator.get_paginated_response(s.MemoryOutSerializer(page, many=True).data)


class MemoryStoreView(APIView):
    @extend_schema(
        request=one_or_many_schema(
            s.MemoryInSerializer, max_items=s.MAX_BATCH, component_name="MemoryStore"
        ),
        responses={
            201: PolymorphicProxySerializer(
                component_name="MemoryStored",
                serializers=[s.StoredMemorySerializer, s.StoredMemoryBatchSerializer],
                resource_type_field_name=None,
                many=False,
            ),
            503: OpenApiResponse(description="The embedding model changed: run memory_reindex."),
            **ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        items, many = validate_one_or_many(
            s.MemoryInSerializer, request.data, max_items=s.MAX_BATCH, noun="memory items"
        )
        for item in items:
            ensure_agent_allowed(request, item["agent_id"])
        stored = memory_store_many(items=items, actor=actor_name(request))
        if not many:
            return Response(
                s.StoredMemorySerializer(stored[0]).data, status=status.HTTP_201_CREATED
            )
        return Response(
            s.StoredMemoryBatchSerializer({"items": stored}).data, status=status.HTTP_201_CREATED
        )


class MemoryDetailView(APIView):
    @extend_schema(responses={200: s.MemoryOutSerializer, 404: OpenApiResponse()})
    def get(self, request: Request, point_id: UUID) -> Response:
        return Response(
            s.MemoryOutSerializer(
                memory_get(point_id=point_id, agent_ids=allowed_agent_ids(request))
            ).data
        )

    @extend_schema(
        request=s.MemoryPatchSerializer,
        responses={
            200: s.StoredMemorySerializer,
            404: OpenApiResponse(),
            409: OpenApiResponse(
                description="`version` is stale: the answer has the item's current_version."
            ),
            503: OpenApiResponse(description="The embedding model changed: run memory_reindex."),
            **ERRORS,
        },
    )
    def patch(self, request: Request, point_id: UUID) -> Response:
        patch = s.MemoryPatchSerializer(data=request.data)
        patch.is_valid(raise_exception=True)
        changes = dict(patch.validated_data)
        version = changes.pop("version")
        item = memory_get(point_id=point_id, agent_ids=allowed_agent_ids(request))
        stored = memory_update(
            item=item, version=version, changes=changes, actor=actor_name(request)
        )
        return Response(s.StoredMemorySerializer(stored).data)

    @extend_schema(responses={204: None, 404: OpenApiResponse()})
    def delete(self, request: Request, point_id: UUID) -> Response:
        item = memory_get(point_id=point_id, agent_ids=allowed_agent_ids(request))
        memory_delete_many(
            queryset=type(item).objects.filter(pk=item.pk), actor=actor_name(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryHistoryView(APIView):
    @extend_schema(
        operation_id="memory_history",
        responses={200: paginated(s.MemoryEventSerializer), 404: OpenApiResponse()},
    )
    def get(self, request: Request, point_id: UUID) -> Response:
        events = memory_history(point_id=point_id, agent_ids=allowed_agent_ids(request))
        paginator = MemoryHistoryPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(s.MemoryEventSerializer(page, many=True).data)


class MemorySearchView(APIView):
    reads_only = True  # a POST for its body; a read-only key may search

    @extend_schema(
        request=s.MemorySearchSerializer,
        # Only where a cross-encoder is configured: elsewhere rerank=true is a 400.
        parameters=[
            OpenApiParameter(
                "rerank", bool, description="Rerank with the configured cross-encoder."
            )
        ]
        if settings.FASTEMBED_RERANK_MODEL
        else [],
        responses={200: s.MemorySearchOutSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        serializer = s.MemorySearchSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        ensure_agent_allowed(request, serializer.validated_data["agent_id"])
        rerank = request.query_params.get("rerank", "false").lower() in {"1", "true", "yes"}
        hits = memory_search(**serializer.validated_data, rerank=rerank)
        return Response(s.MemorySearchOutSerializer({"results": hits}).data)


class MemoryContextView(APIView):
    reads_only = True  # a POST for its body; a read-only key may ask for a context

    @extend_schema(
        request=s.MemoryContextSerializer,
        responses={
            200: s.MemoryContextOutSerializer,
            404: OpenApiResponse(description="No such session (or one this key may not use)."),
            409: OpenApiResponse(description="The session belongs to another agent."),
            410: OpenApiResponse(description="The session is closed or expired."),
            **ERRORS,
        },
        description="The context for the next LLM call in one request: the session's recent "
        "turns, newest first, within recent_share of the budget, then the memories whose "
        "relevance reaches min_relevance, by rank, within the rest. A turn or a memory is in "
        "whole or left out. With the working memory or the vector index down, the other part "
        "still answers and `degraded` names the missing one.",
    )
    def post(self, request: Request) -> Response:
        serializer = s.MemoryContextSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        ensure_agent_allowed(request, serializer.validated_data["agent_id"])
        context = memory_context(**serializer.validated_data, agent_ids=allowed_agent_ids(request))
        return Response(s.MemoryContextOutSerializer(context).data)
