from django.http import HttpResponse
from django_prometheus.exports import ExportToDjangoView
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .health import collect_stats, run_checks
from .permissions import allowed_agent_ids

BackendStatusSerializer = inline_serializer(
    "BackendStatus",
    fields={
        "status": serializers.ChoiceField(
            choices=["ok", "rebuilding", "error"],
            help_text="rebuilding: up, but rebuilding its index from the database (a vector "
            "index found unusable, or never built); searches wait until it is done.",
        ),
        "error": serializers.CharField(required=False),
    },
)
HealthSerializer = inline_serializer(
    "Health",
    fields={
        "status": serializers.ChoiceField(
            choices=["ok", "degraded", "error"],
            help_text="degraded: no backend is down, one is rebuilding (200).",
        ),
        "failed": serializers.ListField(child=serializers.CharField()),
        "backends": serializers.DictField(child=BackendStatusSerializer),
    },
)


class HealthView(APIView):
    """Each backend's status: 200 when all are up (status degraded while one is rebuilding),
    503 naming the ones that are down."""

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []

    @extend_schema(responses={200: HealthSerializer, 503: HealthSerializer}, auth=[])
    def get(self, request: Request) -> Response:
        overall, backends = run_checks()
        failed = [name for name, result in backends.items() if result["status"] == "error"]
        return Response(
            {"status": overall, "failed": failed, "backends": backends},
            status=status.HTTP_503_SERVICE_UNAVAILABLE if failed else status.HTTP_200_OK,
        )


class StatsView(APIView):
    """Global statistics, one section per capability, limited to the key's agents."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(collect_stats(allowed_agent_ids(request)))


class MetricsView(APIView):
    """Prometheus metrics in the text exposition format; needs a key like the rest of the API."""

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        return ExportToDjangoView(request._request)
