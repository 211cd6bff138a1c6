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
# `type` inside: a bare `not: {pattern}` would also refuse a null, which a pattern ignores.
NO_NUL = {"type": "string", "pattern": "\\u0000"}
# Python's strip() also removes U+001C..U+001F and U+0085, which a JSON Schema \s does not match.
NOT_BLANK = {"type": "string", "pattern": "^[\\s\\u001c-\\u001f\\u0085]*$|\\u0000"}
# The parser refuses a NUL in any string of a body (core/parsers.py), free-form JSON and keys
# included: this component is the free-form JSON the API reads, and the extra keys of an object.
JSON_VALUE = "JsonValue"
_JSON_REF = {"$ref": f"#/components/schemas/{JSON_VALUE}"}
_JSON_VALUE_SCHEMA = {
    "description": "Any JSON value with no NUL character (\\u0000) in a string or a key.",
    "type": ["object", "array", "string", "number", "boolean", "null"],
    "not": NO_NUL,
    "items": _JSON_REF,
    "additionalProperties": _JSON_REF,
    "propertyNames": {"not": NO_NUL},
}


class AutoSchema(openapi.AutoSchema):
    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        types = schema.get("type")
        plain_text = (
            isinstance(field, serializers.CharField)
            and (types == "string" or (isinstance(types, list) and "string" in types))
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
_WRITING = [
    (
        "507",
        "The server's storage is full: nothing was written; reads still work. Retry later.",
        _DETAIL,
    )
]


def _is_any(schema: Any) -> bool:
    """drf-spectacular's free-form JSON: `{}`, or `oneOf: [{}, null]` when nullable."""
    if not isinstance(schema, dict):
        return False
    if not schema.keys() - {"description", "default"}:
        return True
    branches = schema.get("oneOf")
    return (
        schema.keys() <= {"oneOf", "description", "default"}
        and isinstance(branches, list)
        and all(_is_any(b) or b == {"type": "null"} for b in branches)
    )


def _one_of_tidied(schema: dict[str, Any]) -> dict[str, Any]:
    """drf-spectacular 3.1 writes a nullable free-form field as `oneOf: [{}, null]` and may
    repeat `{"type": "null"}`: a null then matches two branches, which oneOf forbids."""
    if _is_any(schema):
        return {k: schema[k] for k in ("description",) if k in schema}
    branches: list[Any] = []
    for branch in schema["oneOf"]:
        if branch not in branches:
            branches.append(branch)
    return {**schema, "oneOf": branches}


def _tidied(schema: Any) -> Any:
    """Every oneOf in a schema tidied (_one_of_tidied)."""
    if isinstance(schema, list):
        return [_tidied(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _tidied(v) for k, v in schema.items()}
    return _one_of_tidied(out) if isinstance(out.get("oneOf"), list) else out


def _nul_free(schema: Any) -> Any:
    """A request schema that says what the parser refuses: free-form JSON becomes JsonValue,
    an object's keys and its extra (ignored) properties hold no NUL either."""
    if isinstance(schema, list):
        return [_nul_free(s) for s in schema]
    if not isinstance(schema, dict) or "$ref" in schema:
        return schema
    if _is_any(schema):
        return {**{k: schema[k] for k in ("description",) if k in schema}, **_JSON_REF}
    out = {k: _nul_free(v) if k not in ("properties", "not") else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {name: _nul_free(s) for name, s in schema["properties"].items()}
    if out.get("type") == "object":
        out.setdefault("additionalProperties", _JSON_REF)
        out.setdefault("propertyNames", {"not": NO_NUL})
    return out


def _request_components(result: dict[str, Any]) -> set[str]:
    """Names of the components a request body uses, directly or through another component."""
    prefix = "#/components/schemas/"
    schemas = result.get("components", {}).get("schemas", {})
    todo = [
        media["schema"]
        for item in result["paths"].values()
        for operation in item.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
    ]
    names: set[str] = set()
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
        elif isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith(prefix) and ref[len(prefix) :] not in names:
                names.add(ref[len(prefix) :])
                todo.append(schemas.get(ref[len(prefix) :]))
            todo.extend(node.values())
    return names


def describe_nul_free_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every request body schema says that no string or
    key in it holds a NUL, free-form JSON and extra properties included; and every oneOf lets a
    value match one branch only."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name in _request_components(result):
        schemas[name] = _nul_free(schemas[name])
    for item in result["paths"].values():
        for operation in item.values():
            for media in operation.get("requestBody", {}).get("content", {}).values():
                media["schema"] = _nul_free(media["schema"])
    result["paths"] = _tidied(result["paths"])
    result["components"]["schemas"] = {**_tidied(schemas), JSON_VALUE: _JSON_VALUE_SCHEMA}
    return result


Link = tuple[str, str, str, dict[str, Any]]  # (operationId, status, name, OpenAPI Link Object)


def link(
    operation_id: str,
    parameters: dict[str, str] | None = None,
    request_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OpenAPI Link Object: values for the target's parameters and body, as runtime
    expressions on the response (`$response.body#/id`)."""
    found: dict[str, Any] = {"operationId": operation_id}
    if parameters:
        found["parameters"] = parameters
    if request_body:
        found["requestBody"] = request_body
    return found


def add_links(result: dict[str, Any], links: list[Link]) -> dict[str, Any]:
    """OpenAPI links from a response to the operations that use what it answers (a stored
    item's id to GET it): a client, or schemathesis' stateful phase, follows them."""
    operations = {
        operation["operationId"]: operation
        for item in result["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    for source, status, name, link in links:
        assert link["operationId"] in operations, link  # a link to no operation is a typo
        response = operations[source]["responses"][status]
        response.setdefault("links", {})[name] = link
    return result


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
        for method, operation in path_item.items():
            shared = []
            if any(requirement for requirement in operation.get("security", [])):
                shared += _AUTHENTICATED
                if method != "get":
                    shared += _WRITING  # core/storage.py: a full disk
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
