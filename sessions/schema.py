"""OpenAPI links of the session API: start, then read, update, compress and close."""

from typing import Any

from ferrum_memory.core.schema import Link, add_links, link

_ID = {"session_id": "$response.body#/session_id"}
_FOLLOW = {
    "GetSession": link("session_retrieve", _ID),
    "UpdateSession": link("session_update", _ID, {"version": "$response.body#/version"}),
    "CompressSession": link("memory_compress_create", _ID),
    "CloseSession": link("session_close_create", request_body=_ID),
}
LINKS: list[Link] = [
    *(("session_start_create", "201", name, found) for name, found in _FOLLOW.items()),
    *(("session_update", "200", name, found) for name, found in _FOLLOW.items()),
    ("session_close_create", "202", "GetClosedSession", link("session_retrieve", _ID)),
]


def session_links(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook."""
    return add_links(result, LINKS)
