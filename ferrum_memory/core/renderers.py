"""JSON responses written by orjson: about ten times faster than the standard library encoder
DRF uses, which took 11 ms of a 256-item replay response.

Same output as DRF's JSONRenderer for what this API returns, except that U+2028 and U+2029 are
not escaped (DRF escapes them for embedding in JavaScript; no client here does that)."""

import json
from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder


def json_bytes(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON: by orjson, else (an integer beyond 64 bits, nesting deeper
    than 254 levels) by the standard library."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# NON_STR_KEYS: DRF keys a list's validation errors by index. UTC_Z: DRF writes UTC as "Z".
OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z
# What orjson does not know natively (lazy translation strings, Decimal, ...) goes through DRF's
# encoder, as it did before.
_fallback = JSONEncoder()


class OrjsonRenderer(JSONRenderer):
    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        if self.get_indent(accepted_media_type or "", renderer_context or {}):
            # orjson indents by 2 only; "Accept: application/json; indent=N" keeps DRF's way.
            return super().render(data, accepted_media_type, renderer_context)
        try:
            return orjson.dumps(data, default=_fallback.default, option=OPTIONS)
        except orjson.JSONEncodeError:
            # What orjson refuses and the standard library writes: integers beyond 64 bits,
            # nesting deeper than 254 levels.
            return super().render(data, accepted_media_type, renderer_context)
