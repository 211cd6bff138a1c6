"""Charts for the admin, drawn on the server as inline SVG: no JavaScript, no CDN, no package.

Each chart is an <svg data-chart="NAME"> whose marks carry a class (`bar`, `point`) and a
<title> tooltip, so a browser test can find them and people can hover them.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 400, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 32, 36  # room for the title and the axis labels
MAX_X_LABELS = 8
LABEL_CHARS = 14
# Colours the admin's own CSS does not use, so a screenshot test can tell the charts apart.
BAR_COLOUR = "#4c78a8"
LINE_COLOUR = "#f58518"
POINT_COLOUR = "#e45756"


@dataclass(frozen=True)
class Datum:
    label: str  # under the x axis, when there is room
    value: float | None  # None: no value here (a gap in a line)
    note: str = ""  # the tooltip


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _short(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


class _Plot:
    """Maps data to pixels: slot i of n along x, [low, high] along y."""

    def __init__(self, n: int, low: float, high: float) -> None:
        if high <= low:  # a flat series still needs a scale
            high = low + 1.0
        self.n, self.low, self.high = n, low, high
        self.width, self.height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(self, i: float) -> float:
        return LEFT + self.width * i / self.n

    def y(self, value: float) -> float:
        return TOP + self.height * (1 - (value - self.low) / (self.high - self.low))


def _svg(
    name: str, title: str, plot: _Plot | None, marks: Sequence[str], labels: Sequence[str]
) -> SafeString:
    head = format_html(
        '<svg class="chart" data-chart="{}" role="img" aria-label="{}" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg" font-size="10" '
        'font-family="sans-serif">',
        name,
        title,
        WIDTH,
        HEIGHT,
        WIDTH,
        HEIGHT,
    )
    caption = format_html(
        '<text class="title" x="{}" y="16" font-size="13" font-weight="bold" fill="#333">{}</text>',
        8,
        title,
    )
    if plot is None:
        body = [
            format_html(
                '<text class="empty" x="{}" y="{}" text-anchor="middle" fill="#666">'
                "No data yet</text>",
                WIDTH // 2,
                HEIGHT // 2,
            )
        ]
    else:
        bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
        body = [
            format_html(
                '<path class="axis" d="M{} {}V{}H{}" fill="none" stroke="#999"/>',
                LEFT,
                TOP,
                bottom,
                right,
            )
        ]
        for value in (plot.low, (plot.low + plot.high) / 2, plot.high):
            body.append(
                format_html(
                    '<text x="{}" y="{}" text-anchor="end" dominant-baseline="middle" '
                    'fill="#666">{}</text>',
                    LEFT - 4,
                    f"{plot.y(value):.1f}",
                    _fmt(value),
                )
            )
        step = math.ceil(plot.n / MAX_X_LABELS)
        for i in range(0, plot.n, step):
            body.append(
                format_html(
                    '<text x="{}" y="{}" text-anchor="middle" fill="#666">{}</text>',
                    f"{plot.x(i + 0.5):.1f}",
                    bottom + 14,
                    _short(labels[i]),
                )
            )
    # Safe: every piece was built by format_html, which escapes the labels and notes.
    return mark_safe("".join([head, caption, *body, *marks, "</svg>"]))


def bar_chart(*, name: str, title: str, data: Sequence[Datum]) -> SafeString:
    """Vertical bars from zero (or from the lowest value, when some are negative)."""
    values = [d.value for d in data if d.value is not None]
    if not values:
        return _svg(name, title, None, [], [])
    plot = _Plot(len(data), min(0.0, *values), max(0.0, *values))
    base = plot.y(max(plot.low, 0.0))
    marks = []
    for i, datum in enumerate(data):
        if datum.value is None:
            continue
        top = plot.y(datum.value)
        marks.append(
            format_html(
                '<rect class="bar" x="{}" y="{}" width="{}" height="{}" fill="{}">'
                "<title>{}</title></rect>",
                f"{plot.x(i + 0.1):.1f}",
                f"{min(top, base):.1f}",
                f"{plot.width * 0.8 / plot.n:.1f}",
                # A zero-count bin still shows a hairline, so an empty bin reads as 0.
                f"{max(abs(base - top), 0.5):.1f}",
                BAR_COLOUR,
                datum.note or f"{datum.label}: {_fmt(datum.value)}",
            )
        )
    return _svg(name, title, plot, marks, [d.label for d in data])


def line_chart(
    *,
    name: str,
    title: str,
    data: Sequence[Datum],
    low: float | None = None,
    high: float | None = None,
) -> SafeString:
    """Points joined by a line; a None value leaves a gap. `low`/`high` fix the y range."""
    values = [d.value for d in data if d.value is not None]
    if not values:
        return _svg(name, title, None, [], [])
    plot = _Plot(
        len(data), min(values) if low is None else low, max(values) if high is None else high
    )
    segments: list[list[str]] = [[]]
    marks = []
    for i, datum in enumerate(data):
        if datum.value is None:
            segments.append([])
            continue
        x, y = f"{plot.x(i + 0.5):.1f}", f"{plot.y(datum.value):.1f}"
        segments[-1].append(f"{x},{y}")
        marks.append(
            format_html(
                '<circle class="point" cx="{}" cy="{}" r="3" fill="{}"><title>{}</title></circle>',
                x,
                y,
                POINT_COLOUR,
                datum.note or f"{datum.label}: {_fmt(datum.value)}",
            )
        )
    lines = [
        format_html(
            '<polyline class="line" points="{}" fill="none" stroke="{}" stroke-width="2"/>',
            " ".join(segment),
            LINE_COLOUR,
        )
        for segment in segments
        if len(segment) > 1
    ]
    return _svg(name, title, plot, lines + marks, [d.label for d in data])
