"""A profile drawn as an SVG Gantt chart (:meth:`airstream.debug.profile.Profile.svg`).

A lane per stream, the calls side by side (the time between them cut out), a time axis, a
legend, ops named where they fit, waits hatched, an arrow from each record to the end of the
wait it releases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from xml.sax.saxutils import escape

from airstream.debug.report import stream_name

if TYPE_CHECKING:
    from airstream.runtime.trace import OpRecord, SyncRecord

__all__ = ["Timeline", "render_svg"]


class Timeline(Protocol):
    """What the chart draws (an :class:`airstream.debug.profile.Profile`)."""

    events: list[OpRecord]
    waits: list[SyncRecord]
    records: list[SyncRecord]
    calls: list[tuple[int, int, int]]  # (call id, start ns, end ns)

    @property
    def streams(self) -> list[str | None]: ...

    @property
    def wall_ns(self) -> int: ...

    def flows(self) -> list[tuple[SyncRecord, SyncRecord]]: ...


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")
_IDLE = "#f0f0f0"  # a lane's background: no op running
_DEFS = (
    "<defs>"
    '<pattern id="blocked" patternUnits="userSpaceOnUse" width="6" height="6" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#d9d9d9"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#888" stroke-width="2"/></pattern>'
    '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
    'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c00"/>'
    "</marker></defs>"
)


def _text_px(text: str, size: float = 10) -> float:
    """A generous estimate of ``text``'s width in a sans-serif font of ``size`` px."""
    em = {**dict.fromkeys("mwMW@", 0.98), **dict.fromkeys("ijlt.,:;|!'() ", 0.36)}
    return size * sum(em.get(c, 0.74 if c.isupper() else 0.64) for c in text)


def _ink(colour: str) -> str:
    """Black or white, whichever reads better on ``colour`` (``#rrggbb``)."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 160 else "#fff"


def _tick_step(total_ns: int, px: float) -> int:
    """A 1-2-5 step in ns giving a tick about every 90 px."""
    target = max(total_ns * 90 / max(px, 1.0), 1.0)
    magnitude = 10 ** math.floor(math.log10(target))
    return int(next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= target))


def _time_label(ns: int, step: int) -> str:
    """``ns`` in ms when ticks are at least 1 ms apart, else in us."""
    if ns == 0:
        return "0"
    if step >= 1_000_000:
        return f"{ns / 1e6:g} ms"
    return f"{ns / 1e3:g} us"


@dataclass(frozen=True)
class _Layout:
    """Where the SVG draws a moment of a call: the calls side by side, gaps between them cut."""

    x0: float
    scale: float  # px per ns
    calls: dict[int, tuple[int, int, int]]  # call id -> (start ns, end ns, ns drawn before it)

    def x(self, call: int, ns: int) -> float:
        """The x of ``ns`` (host time) in ``call``, clamped to the call."""
        start, end, before = self.calls[call]
        return self.x0 + (before + min(max(ns, start), end) - start) * self.scale

    def width(self, call: int, start: int, end: int) -> float:
        """The drawn width of a span of ``call``."""
        return self.x(call, end) - self.x(call, start)


def _layout(prof: Timeline, x0: float, plot_w: float) -> _Layout:
    calls, before = {}, 0
    for call, start, end in prof.calls:
        calls[call] = (start, end, before)
        before += end - start
    return _Layout(x0, plot_w / max(before, 1), calls)


def render_svg(prof: Timeline, width: int = 1200) -> str:
    """A Gantt chart of ``prof``: a lane per stream, the calls side by side (the time between
    them cut out), a time axis, a legend, ops named where they fit, waits hatched, an arrow
    from each record to the end of the wait it releases."""
    lanes = prof.streams
    label_w = max(70, int(max(_text_px(stream_name(s), 12) for s in lanes)) + 12)
    plot_w = width - label_w - 30
    layout = _layout(prof, label_w, plot_w)
    top, pitch = 44, 30
    axis_y = top + pitch * len(lanes) + 2
    legend, legend_h = _legend(lanes, width, axis_y + 40)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{axis_y + 40 + legend_h}" font-family="sans-serif" font-size="11">',
        _DEFS,
        f'<rect width="{width}" height="{axis_y + 40 + legend_h}" fill="#fff"/>',
        f'<text class="title" x="4" y="16" font-size="13">airstream timeline: '
        f"{len(prof.calls)} call(s), wall {prof.wall_ns / 1e3:.1f} us "
        "(the calls side by side, the time between them cut out)</text>",
    ]
    for i, label in enumerate(lanes):
        parts += _lane(prof, label, i, layout, top + i * pitch, plot_w)
    parts += _calls(prof, layout, top - 16, axis_y)
    parts += _axis(prof.wall_ns, layout, axis_y, plot_w)
    parts += _flows(prof, layout, {label: top + i * pitch for i, label in enumerate(lanes)})
    parts += legend
    parts.append("</svg>")
    return "\n".join(parts)


def _lane(
    prof: Timeline, label: str | None, index: int, layout: _Layout, y: int, plot_w: float
) -> list[str]:
    """One stream's lane: its waits (hatched), records (ticks) and ops (named if wide)."""
    name, colour = escape(stream_name(label)), _PALETTE[index % len(_PALETTE)]
    parts = [
        f'<g class="lane" data-stream="{name}">',
        f'<text x="4" y="{y + 18}" font-weight="bold">{name}</text>',
        f'<rect x="{layout.x0}" y="{y}" width="{plot_w:.2f}" height="28" fill="{_IDLE}"/>',
    ]
    for w in (w for w in prof.waits if w.stream == label):
        x, wide = layout.x(w.call, w.start_ns), layout.width(w.call, w.start_ns, w.end_ns)
        tip = f"wait e{w.event}: blocked {(w.end_ns - w.start_ns) / 1e3:.1f} us"
        parts.append(
            f'<rect class="wait" {_ids(w)} x="{x:.2f}" y="{y + 3}" width="{max(wide, 1):.2f}" '
            f'height="22" fill="url(#blocked)" stroke="#777" stroke-width="0.5">'
            f"<title>{tip}</title></rect>"
        )
        parts += _bar_text(f"wait e{w.event}", x, wide, y, "#222", "wait-name")
    for r in (r for r in prof.events if r.stream == label):
        x, wide = layout.x(r.call, r.start_ns), layout.width(r.call, r.start_ns, r.end_ns)
        tip = f"{r.name}: {(r.end_ns - r.start_ns) / 1e3:.1f} us" + (
            "\n" + r.detail if r.detail else ""
        )
        parts.append(
            f'<rect class="op" x="{x:.2f}" y="{y + 3}" width="{max(wide, 0.5):.2f}" '
            f'height="22" fill="{colour}" stroke="#fff" stroke-width="0.5">'
            f"<title>{escape(tip)}</title></rect>"
        )
        parts += _bar_text(r.name, x, wide, y, _ink(colour), "op-name")
    for s in (s for s in prof.records if s.stream == label):
        x = layout.x(s.call, s.start_ns)
        parts.append(
            f'<rect class="record" {_ids(s)} x="{x:.2f}" y="{y + 1}" width="2" height="26" '
            f'fill="#222"><title>record e{s.event}</title></rect>'
        )
    parts.append("</g>")
    return parts


def _calls(prof: Timeline, layout: _Layout, y: int, bottom: int) -> list[str]:
    """A thin separator at the start of each call and its "call N" label."""
    parts = []
    for n, (call, start, end) in enumerate(prof.calls, 1):
        x, wide = layout.x(call, start), layout.width(call, start, end)
        parts.append(
            f'<line class="call-separator" x1="{x:.2f}" y1="{y - 4}" x2="{x:.2f}" '
            f'y2="{bottom}" stroke="#555" stroke-width="1"><title>call {n}: '
            f"{(end - start) / 1e3:.1f} us</title></line>"
        )
        text = next((t for t in (f"call {n}", f"{n}") if wide >= _text_px(t, 11) + 6), "")
        if text:
            parts.append(
                f'<text class="call-label" x="{x + 3:.2f}" y="{y + 8}" fill="#444">'
                f"{text}<title>call {n}: {(end - start) / 1e3:.1f} us</title></text>"
            )
    return parts


def _flows(prof: Timeline, layout: _Layout, lane_y: dict[str | None, int]) -> list[str]:
    """An arrow from each record's start to the end of the wait it releases, from the edge
    of the record's bar to the facing edge of the wait's (along the gap between lanes)."""
    parts = []
    for source, w in prof.flows():
        x1, x2 = layout.x(source.call, source.start_ns), layout.x(w.call, w.end_ns)
        y1, y2 = lane_y[source.stream] + 14, lane_y[w.stream] + 14
        if y1 != y2:  # bars span y + 3 .. y + 25
            y1, y2 = (y1 - 11, y2 + 11) if y1 > y2 else (y1 + 11, y2 - 11)
        parts.append(
            f'<line class="flow" {_ids(w)} x1="{x1 + 1:.2f}" y1="{y1}" x2="{x2:.2f}" '
            f'y2="{y2}" stroke="#c00" stroke-width="1" stroke-opacity="0.8" '
            f'marker-end="url(#arrow)"><title>record e{w.event} releases the wait</title>'
            "</line>"
        )
    return parts


def _ids(sync: SyncRecord) -> str:
    """The SVG attributes naming a record's or wait's call and event."""
    return f'data-call="{sync.call}" data-event="{sync.event}"'


def _bar_text(text: str, x: float, wide: float, y: int, ink: str, cls: str) -> list[str]:
    """``text`` written on a bar at ``x`` when the bar is wide enough to hold it."""
    if wide < _text_px(text) + 6:
        return []
    return [
        f'<text class="{cls}" x="{x + 3:.2f}" y="{y + 18}" font-size="10" fill="{ink}" '
        f'pointer-events="none">{escape(text)}</text>'
    ]


def _axis(total_ns: int, layout: _Layout, y: int, plot_w: float) -> list[str]:
    """The time axis under the lanes: time within the profiled calls, ticks in us or ms."""
    x0, step = layout.x0, _tick_step(total_ns, plot_w)
    parts = [
        f'<g class="axis" data-ns-per-px="{1 / layout.scale:.6g}">',
        f'<line x1="{x0}" y1="{y}" x2="{x0 + plot_w:.2f}" y2="{y}" stroke="#333"/>',
        f'<text x="4" y="{y + 16}" fill="#333">time</text>',
    ]
    for ns in range(0, total_ns + 1, step):
        x = x0 + ns * layout.scale
        parts.append(
            f'<line class="tick" data-ns="{ns}" x1="{x:.2f}" y1="{y}" x2="{x:.2f}" '
            f'y2="{y + 5}" stroke="#333"/>'
        )
        parts.append(
            f'<text class="tick-label" x="{x:.2f}" y="{y + 16}" text-anchor="middle" '
            f'fill="#333">{_time_label(ns, step)}</text>'
        )
    parts.append("</g>")
    return parts


def _legend(lanes: list[str | None], width: int, y: int) -> tuple[list[str], int]:
    """The legend, wrapped to ``width``; returns its parts and height."""
    items: list[tuple[str, str]] = [
        (
            f'<rect width="14" height="12" fill="{_PALETTE[i % len(_PALETTE)]}"/>',
            f"{stream_name(label)}: running an op",
        )
        for i, label in enumerate(lanes)
    ]
    items += [
        (
            '<rect width="14" height="12" fill="url(#blocked)" stroke="#777" stroke-width="0.5"/>',
            "blocked in a wait (for another stream's record)",
        ),
        (
            f'<rect width="14" height="12" fill="{_IDLE}" stroke="#bbb" stroke-width="0.5"/>',
            "idle: no op running (Python dispatch, hand-offs)",
        ),
        ('<rect x="6" y="-1" width="2" height="14" fill="#222"/>', "record: event reached"),
        (
            '<line x1="0" y1="6" x2="14" y2="6" stroke="#c00" stroke-width="1.2" '
            'marker-end="url(#arrow)"/>',
            "record \u2192 the wait it releases",
        ),
    ]
    parts, x, row = ['<g class="legend">'], 4.0, 0
    for glyph, text in items:
        item_w = 20 + _text_px(text, 11) * 0.92 + 16
        if x > 4 and x + item_w > width:
            x, row = 4.0, row + 1
        parts.append(
            f'<g class="legend-item" transform="translate({x:.1f},{y + row * 20})">{glyph}'
            f'<text x="20" y="10">{escape(text)}</text></g>'
        )
        x += item_w
    parts.append("</g>")
    return parts, (row + 1) * 20 + 6
