"""OpenAPI additions: the API key security scheme, and the error answers every operation shares."""

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from .parsers import MAX_JSON_DEPTH


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "ferrum_memory.core.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: `manage.py create_api_key`.",
        }


# What DRF's CharField refuses beyond the schema's maxLength: a NUL character anywhere, and (unless
# blank is allowed) text that is empty once trimmed. As `not`, which a generator checks after
# making a string, rather than a `pattern` it must make strings from (several times slower).
NO_NUL = {"pattern": "\\u0000"}
# Python's strip() also removes U+001C..U+001F and U+0085, which a JSON Schema \s does not match.
NOT_BLANK = {"pattern": "^[\\s\\u001c-\\u001f\\u0085]*$|\\u0000"}


class AutoSchema(openapi.AutoSchema):
    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        plain_text = (
            isinstance(field, serializers.CharField)
            and schema.get("type") == "string"
            and not schema.keys() & {"format", "pattern", "enum", "not"}
            # A RegexValidator's pattern is added after this method, and only if none is set.
            and not any(isinstance(v, RegexValidator) for v in field.validators)
        )
        if direction == "request" and plain_text:
            blank_refused = not field.allow_blank and field.trim_whitespace
            schema["not"] = NOT_BLANK if blank_refused else NO_NUL
        return schema

    def _unwrap_list_serializer(self, serializer: Any, direction: Any) -> Any:
        """A list of objects (`many=True`) says how many items it takes: drf-spectacular leaves
        out the ListSerializer's allow_empty, min_length and max_length."""
        schema = super()._unwrap_list_serializer(serializer, direction)
        if schema and isinstance(serializer, serializers.ListSerializer):
            # ListSerializer sets them in __init__; the stubs do not declare them.
            min_length, max_length = (getattr(serializer, a) for a in ("min_length", "max_length"))
            min_items = max(min_length or 0, 0 if serializer.allow_empty else 1)
            if min_items:
                schema["minItems"] = min_items
            if max_length is not None:
                schema["maxItems"] = max_length
        return schema


def paginated(serializer: type[serializers.Serializer]) -> serializers.Serializer:
    """The page a CursorPagination answers with; an APIView's schema does not know it pages."""
    name = serializer.__name__.removesuffix("Serializer")
    return inline_serializer(
        f"Paginated{name}List",
        fields={
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer(many=True),
        },
    )


_DETAIL = {"$ref": "#/components/schemas/Error"}
_FIELD_ERRORS = {"$ref": "#/components/schemas/ValidationError"}
# Answers any operation may give, whatever its view documents: (status, when, body schema).
_AUTHENTICATED = [
    ("401", "No API key, or an invalid or revoked one.", _DETAIL),
    ("403", "A read-only key that writes, or a key that may not use this agent.", _DETAIL),
    ("429", "Too many requests with this key; retry after Retry-After seconds.", _DETAIL),
]
_WITH_BODY = [("400", "Invalid input, with errors per field.", _FIELD_ERRORS)]
_WITH_PATH = [("404", "Not found.", _DETAIL)]


def document_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add the shared error answers, so that no view has to
    remember them, and a client (or schemathesis) finds every status code the API can send."""
    result["info"]["description"] += (
        " Request bodies are JSON of at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes, nested at most"
        f" {MAX_JSON_DEPTH} levels, with no NUL character (\\u0000) in any string."
    )
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = {
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    }
    schemas["ValidationError"] = {
        "type": "object",
        "description": "Messages per field (a list, or an object for a nested field); "
        "`non_field_errors` or `detail` for the request as a whole.",
        "additionalProperties": True,
    }
    for path_item in result["paths"].values():
        for operation in path_item.values():
            shared = []
            if any(requirement for requirement in operation.get("security", [])):
                shared += _AUTHENTICATED
            parameters = operation.get("parameters", [])
            if "requestBody" in operation or any(p["in"] == "query" for p in parameters):
                shared += _WITH_BODY
            if any(p["in"] == "path" for p in parameters):
                shared += _WITH_PATH
            if "requestBody" in operation:
                # Every body the API reads has a required field (an empty one is a 400); a body
                # that is one object or a list (oneOf) hides that from drf-spectacular.
                operation["requestBody"]["required"] = True
            for parameter in parameters:
                if parameter["in"] == "query" and not parameter.get("required"):
                    # DRF reads a query like a form: an empty optional value counts as not given.
                    parameter["allowEmptyValue"] = True
            responses = operation.setdefault("responses", {})
            for code, description, schema in shared:
                responses.setdefault(
                    code,
                    {
                        "description": description,
                        "content": {"application/json": {"schema": schema}},
                    },
                )
    return result
