"""Headless Chromium for the dashboard test: find it, load a page, read the DOM, the console
and the pixels.

Also a URLconf for the live server: the project's URLs plus a test-only door that sets the
session cookie of a logged-in user (Chromium's command line cannot set a cookie itself), and a
page that breaks the content security policy, to prove that a violation would be seen.
"""

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import include, path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # The page's console messages (a CSP violation is one) go to stderr.
    "--enable-logging=stderr",
    "--v=0",
]
TIMEOUT_SECONDS = 60
# `[...:INFO:CONSOLE:12] "message", source: url (12)`; older Chromium writes CONSOLE(12).
CONSOLE_LINE = re.compile(r':CONSOLE[:(]?\d*\)?\] "(?P<message>.*)", source: ')


def require_chromium() -> str:
    """Chromium's path. Missing: skip on a developer's machine, fail in CI (never a silent skip).

    Install it with `apt-get install -y chromium` (Debian); .ci/run does."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "Chromium is not installed: apt-get update && apt-get install -y chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass(frozen=True)
class Visit:
    stdout: str  # the DOM with --dump-dom
    console: list[str]  # the page's console messages

    @property
    def csp_violations(self) -> list[str]:
        return [message for message in self.console if "Content Security Policy" in message]


def chromium(binary: str, profile: Path, url: str, *extra: str) -> Visit:
    """Run Chromium once on `url` with a fresh profile; return its stdout and console."""
    result = subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    console = [m["message"] for m in map(CONSOLE_LINE.search, result.stderr.splitlines()) if m]
    return Visit(result.stdout, console)


def login_url(live_server_url: str, session_key: str, next_path: str) -> str:
    return f"{live_server_url}/__test__/session/{session_key}?next={next_path}"


def set_session_cookie(request: HttpRequest, key: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(request.GET.get("next", "/admin/"))
    response.set_cookie(settings.SESSION_COOKIE_NAME, key, httponly=True, samesite="Lax")
    return response


CSP_CANARY = "/__test__/csp-canary"


def csp_canary(request: HttpRequest) -> HttpResponse:
    """A page with an inline style and script, which the policy must block (and report)."""
    return HttpResponse(
        "<!DOCTYPE html><title>canary</title><style>p { color: red }</style>"
        "<p>canary</p><script>document.title = 'ran'</script>"
    )


urlpatterns = [
    path("__test__/session/<str:key>", set_session_cookie),
    path(CSP_CANARY.lstrip("/"), csp_canary),
    path("", include("ferrum_memory.urls")),
]


class ChartCensus(HTMLParser):
    """Counts, per <svg data-chart=NAME>, the marks drawn in it (rect.bar, circle.point), and
    collects every external resource the page asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, Counter[str]] = {}
        self.resources: list[str] = []
        self._chart: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        chart = attributes.get("data-chart")
        if tag == "svg" and chart:
            self._chart = chart
            self.marks[chart] = Counter()
        elif self._chart is not None and attributes.get("class") in ("bar", "point", "empty"):
            self.marks[self._chart][attributes["class"] or ""] += 1
        for name in ("src", "href"):
            value = attributes.get(name)
            if tag in ("script", "link", "img") and value:
                self.resources.append(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None


def census(dom: str) -> ChartCensus:
    parser = ChartCensus()
    parser.feed(dom)
    return parser


def png_pixels(data: bytes) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes) to H x W x C.

    There is no image library among the dependencies; PNG is zlib plus five row filters."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat = 8, b""
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, -1)
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:].astype(np.int64)
        line: Any
        if kind == 0:  # None
            line = row
        elif kind == 2:  # Up
            line = row + previous
        elif kind == 1:  # Sub: a running sum along each channel
            line = np.cumsum(row.reshape(width, channels), axis=0).reshape(-1)
        else:  # Average (3) and Paeth (4) depend on the pixel just decoded: one at a time
            line = _unfilter_sequential(int(kind), row.tolist(), previous.tolist(), channels)
        out[y] = previous = (np.asarray(line) % 256).astype(np.uint8)
    return out.reshape(height, width, channels)


def _unfilter_sequential(kind: int, row: list[int], up: list[int], bpp: int) -> list[int]:
    line = [0] * len(row)
    for i, value in enumerate(row):
        a = line[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            line[i] = (value + (a + b) // 2) % 256
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        line[i] = (value + predictor) % 256
    return line


def count_colour(pixels: np.ndarray, hex_colour: str) -> int:
    rgb = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(pixels[..., :3] == rgb, axis=-1).sum())
