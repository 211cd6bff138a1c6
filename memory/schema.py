"""OpenAPI links of the memory API (drf-spectacular cannot derive them)."""

from typing import Any

from ferrum_memory.core.schema import Link, add_links, link

_ONE = {"point_id": "$response.body#/point_id"}
_FIRST = {"point_id": "$response.body#/items/0/point_id"}
LINKS: list[Link] = [
    ("memory_store_create", "201", "GetStoredItem", link("memory_retrieve", _ONE)),
    ("memory_store_create", "201", "DeleteStoredItem", link("memory_destroy", _ONE)),
    ("memory_store_create", "201", "GetFirstOfBatch", link("memory_retrieve", _FIRST)),
    (
        "memory_retrieve",
        "200",
        "DeleteItem",
        link("memory_destroy", {"point_id": "$response.body#/id"}),
    ),
]


def memory_links(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook."""
    return add_links(result, LINKS)


# Rules across fields that a serializer cannot state in the schema, as the request each
# component refuses (`not`): a context request gives recent_share or memory_share, not both; a
# search's session_diversity is for hybrid search alone.
REFUSED: dict[str, dict[str, Any]] = {
    "MemoryContextRequest": {"required": ["recent_share", "memory_share"]},
    "MemorySearchRequest": {
        "required": ["session_diversity", "mode"],
        "properties": {"mode": {"enum": ["dense", "sparse"]}},
    },
}


def cross_field_rules(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: REFUSED, as each request component's `not`."""
    schemas = result.get("components", {}).get("schemas", {})
    for component, refused in REFUSED.items():
        if component in schemas:
            schemas[component]["not"] = refused
    return result
