"""JSON request bodies read by orjson: about five times faster than the standard library.

Like DRF's JSONParser, a malformed body is a 400 "JSON parse error - ...", and so are NaN and
Infinity. Unlike it, a number too large for a double (1e999) is a parse error too, rather than an
infinity for the field validation to refuse, and an integer beyond 64 bits becomes a float: a
counting field refuses it, free-form JSON (arguments, metadata) keeps it rounded."""

import codecs
from collections.abc import Mapping
from typing import Any

import orjson
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class OrjsonParser(JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            body = stream.read()
            if codecs.lookup(encoding).name != "utf-8":  # orjson reads UTF-8 only
                body = body.decode(encoding)
            return orjson.loads(body)
        except (ValueError, LookupError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ParseError(f"JSON parse error - {exc}") from exc
