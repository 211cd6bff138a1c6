from typing import Any

from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError


def validate_one_or_many(
    serializer_class: type[serializers.Serializer], data: Any, *, max_items: int, noun: str
) -> tuple[list[dict[str, Any]], bool]:
    """Validate a request body that is one object or a list of 1..max_items of them, whole,
    before anything is written. Returns the validated items and whether a list was sent."""
    many = isinstance(data, list)
    if many and not 1 <= len(data) <= max_items:
        raise ValidationError({"non_field_errors": [f"Send 1 to {max_items} {noun}."]})
    serializer = serializer_class(data=data, many=many)
    serializer.is_valid(raise_exception=True)
    validated = serializer.validated_data
    return (list(validated) if many else [validated]), many


def one_or_many_schema(
    serializer_class: type[serializers.Serializer], *, max_items: int, component_name: str
) -> PolymorphicProxySerializer:
    """The OpenAPI shape of what validate_one_or_many accepts."""
    return PolymorphicProxySerializer(
        component_name=component_name,
        serializers=[
            serializer_class,
            serializer_class(many=True, min_length=1, max_length=max_items),  # type: ignore[call-arg]
        ],
        resource_type_field_name=None,
        many=False,
    )
