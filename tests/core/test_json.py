"""The orjson renderer and parser: DRF's JSON behaviour, faster."""

import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.exceptions import ParseError
from rest_framework.renderers import JSONRenderer

from ferrum_memory.core.parsers import OrjsonParser
from ferrum_memory.core.renderers import OrjsonRenderer, json_bytes


def test_renders_what_drf_renders():
    data = {
        "at": datetime(2026, 1, 2, 3, 4, 5, 60, tzinfo=UTC),
        "whole": datetime(2026, 1, 2, tzinfo=UTC),
        "lazy": gettext_lazy("Not found."),
        "price": Decimal("1.25"),
        "errors": {0: ["bad"], 3: {"name": ["required"]}},  # a list's errors, keyed by index
        "text": "é ✓",
        "nothing": None,
    }
    assert json.loads(OrjsonRenderer().render(data)) == json.loads(JSONRenderer().render(data))
    assert OrjsonRenderer().render(None) == b""


def test_what_orjson_refuses_is_rendered_the_standard_way():
    assert json.loads(OrjsonRenderer().render({"big": 2**70})) == {"big": 2**70}
    assert json_bytes([2**70]) == b"[1180591620717411303424]"


def test_an_indent_asked_for_is_honoured():
    rendered = OrjsonRenderer().render({"a": [1]}, "application/json; indent=2")
    assert rendered.decode() == '{\n  "a": [\n    1\n  ]\n}'


def parse(body: bytes, encoding: str = "utf-8"):
    return OrjsonParser().parse(io.BytesIO(body), "application/json", {"encoding": encoding})


def test_parses_json_in_the_declared_encoding():
    assert parse('{"a": "é"}'.encode()) == {"a": "é"}
    assert parse('{"a": "é"}'.encode("latin-1"), "latin-1") == {"a": "é"}


@pytest.mark.parametrize(
    "body", [b"{not json", b'{"a": NaN}', b"[Infinity]", b"[-Infinity]", b"[1e999]", b"\xff"]
)
def test_malformed_or_non_finite_json_is_a_parse_error(body):
    with pytest.raises(ParseError, match=r"^JSON parse error - "):
        parse(body)
