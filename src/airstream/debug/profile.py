"""``airstream.profile()``: a per-stream timeline of compiled calls.

    with airstream.profile() as prof:
        compiled(x)
    print(prof.summary())
    prof.export_chrome_trace("trace.json")   # Perfetto / chrome://tracing: a track per stream
    prof.export_svg("timeline.svg")          # a Gantt chart, a lane per stream

Times are host times from ``time.perf_counter_ns``: on CPU they are when each op ran; on CUDA
they are when each op was issued (kernels run later, asynchronously). A call's clock starts once
its code is ready (the first profiled call generates the traced code before it starts).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from airstream.runtime.trace import (
    CallTrace,
    OpRecord,
    SyncRecord,
    add_listener,
    remove_listener,
)

__all__ = ["Profile", "StreamStats", "profile"]

_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")
_IDLE = "#f0f0f0"  # a lane's background: no op running
_EXPLAIN = (
    "busy: running an op. blocked: in a wait for another stream's record. idle: neither (Python\n"
    "  dispatch between ops, handing work to threads at a call's start and joining them at its\n"
    "  end, a side stream's time before its first op or after its last)."
)


def _overlap_words(streams: int) -> str:
    """What the "streams busy at once" figure means, for ``streams`` streams."""
    if streams < 2:
        return "(one stream: nothing to overlap)"
    most = "both streams" if streams == 2 else f"all {streams} streams"
    return (
        "(busy summed over streams / time some stream ran an op:\n  1.00 = the streams' work "
        f"never overlapped, {streams}.00 = {most} busy the whole time)"
    )


def _name(label: str | None) -> str:
    return "main" if label is None else label


def _union_ns(spans: list[tuple[int, int]]) -> int:
    """Total length covered by the ``(start, end)`` spans (times >= 0)."""
    total, reach = 0, 0
    for start, end in sorted(spans):
        total += max(0, end - max(start, reach))
        reach = max(reach, end)
    return total


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
class StreamStats:
    """Per stream, over all profiled calls: time running ops, blocked in waits, and idle."""

    busy_ns: int
    blocked_ns: int
    idle_ns: int


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


class Profile:
    """Records of every compiled call made while the profile was active."""

    def __init__(self) -> None:
        self.events: list[OpRecord] = []
        self.waits: list[SyncRecord] = []
        self.records: list[SyncRecord] = []
        self.calls: list[tuple[int, int, int]] = []  # (call id, start ns, end ns)
        self._lock = threading.Lock()

    def _add(self, trace: CallTrace) -> None:
        with self._lock:
            self.events += sorted(trace.ops, key=lambda r: r.start_ns)
            self.waits += [s for s in trace.syncs if s.kind == "wait"]
            self.records += [s for s in trace.syncs if s.kind == "record"]
            self.calls.append((trace.call, trace.start_ns, trace.end_ns))

    @property
    def streams(self) -> list[str | None]:
        """Stream labels seen (running ops, recording or waiting), main first."""
        labels: dict[str | None, None] = {None: None}
        labels.update((r.stream, None) for r in self.events)
        labels.update((s.stream, None) for s in self.records + self.waits)
        return list(labels)

    @property
    def wall_ns(self) -> int:
        """Total wall time of the profiled calls (the time between calls left out)."""
        return sum(end - start for _, start, end in self.calls)

    def stats(self) -> dict[str | None, StreamStats]:
        """Busy, blocked and idle time per stream."""
        wall = self.wall_ns
        out = {}
        for label in self.streams:
            busy = sum(r.end_ns - r.start_ns for r in self.events if r.stream == label)
            blocked = sum(w.end_ns - w.start_ns for w in self.waits if w.stream == label)
            out[label] = StreamStats(busy, blocked, max(0, wall - busy - blocked))
        return out

    def any_busy_ns(self) -> int:
        """Time some stream was running an op (per call, the union of all streams' ops)."""
        spans: dict[int, list[tuple[int, int]]] = {}
        for r in self.events:
            spans.setdefault(r.call, []).append((r.start_ns, r.end_ns))
        return sum(_union_ns(s) for s in spans.values())

    def overlap(self) -> float:
        """Streams busy at once, on average while any is: busy time summed over streams over
        the time some op ran. 1.0 = the streams' ops never overlapped, 2.0 = two streams busy
        together the whole time (0.0 without ops)."""
        any_busy = self.any_busy_ns()
        return sum(s.busy_ns for s in self.stats().values()) / any_busy if any_busy else 0.0

    def summary(self) -> str:
        """Per stream: busy, blocked and idle time; then what share of the wall ran ops and
        how many streams ran them at once, in words."""
        wall = self.wall_ns
        lines = [
            f"{len(self.calls)} call(s), {len(self.events)} ops, wall {wall / 1e3:.1f} us "
            "(the calls' own time, gaps between calls left out)",
            f"{'stream':<16}{'ops':>6}{'busy us':>11}{'blocked us':>12}{'idle us':>10}",
        ]
        for label, s in self.stats().items():
            ops = sum(1 for r in self.events if r.stream == label)
            lines.append(
                f"{_name(label):<16}{ops:>6}{s.busy_ns / 1e3:>11.1f}{s.blocked_ns / 1e3:>12.1f}"
                f"{s.idle_ns / 1e3:>10.1f}"
            )
        lines.append(_EXPLAIN)
        share = self.any_busy_ns() / wall if wall else 0.0
        lines.append(f"some stream running an op: {share:.0%} of the wall")
        lines.append(
            f"streams busy at once: {self.overlap():.2f} {_overlap_words(len(self.streams))}"
        )
        segments = {r.name: r.detail for r in self.events if r.detail}
        if segments:  # max-autotune: what each segment step is
            lines.append("segments (max-autotune):")
            lines += [f"  {detail}" for detail in segments.values()]
        return "\n".join(lines)

    def flows(self) -> list[tuple[SyncRecord, SyncRecord]]:
        """``(record, wait)`` pairs: each wait with the record that released it. The event is
        set between the record's start and end, so a wait returns after the record's start
        (possibly before its end); a pair where it does not cannot happen and is left out."""
        recorded = {(s.call, s.event): s for s in self.records}
        pairs = []
        for w in self.waits:
            source = recorded.get((w.call, w.event))
            if source is not None and w.end_ns >= source.start_ns:
                pairs.append((source, w))
        return pairs

    def _origin(self) -> int:
        return min((start for _, start, _ in self.calls), default=0)

    def chrome_trace(self) -> dict[str, Any]:
        """The profile in the Trace Event format: a track per stream, a flow from each record
        to the end of the wait it releases (forwards in time)."""
        origin = self._origin()
        tid = {label: i + 1 for i, label in enumerate(self.streams)}

        def us(ns: int) -> float:
            return (ns - origin) / 1e3

        def slice_(cat: str, name: str, label: str | None, start: int, end: int) -> dict[str, Any]:
            dur = max((end - start) / 1e3, 0.001)
            return dict(ph="X", cat=cat, name=name, pid=1, tid=tid[label], ts=us(start), dur=dur)

        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "airstream"}}
        ]
        for label, t in tid.items():
            meta = {"ph": "M", "pid": 1, "tid": t}
            events.append(
                meta | {"name": "thread_name", "args": {"name": f"stream {_name(label)}"}}
            )
            events.append(meta | {"name": "thread_sort_index", "args": {"sort_index": t}})
        for r in self.events:
            args = {"call": r.call, "thread": r.thread} | (
                {"segment": r.detail} if r.detail else {}
            )
            events.append(slice_("op", r.name, r.stream, r.start_ns, r.end_ns) | {"args": args})
        for s in self.records:
            record = slice_("record", f"record e{s.event}", s.stream, s.start_ns, s.end_ns)
            events.append(record | {"args": {"call": s.call}})
        for w in self.waits:
            wait = slice_("wait", f"wait e{w.event}", w.stream, w.start_ns, w.end_ns)
            blocked = (w.end_ns - w.start_ns) / 1e3
            events.append(wait | {"args": {"call": w.call, "blocked_us": blocked}})
        for flow_id, (source, w) in enumerate(self.flows()):
            common = {"cat": "sync", "name": f"e{w.event}", "id": flow_id, "pid": 1}
            # the end inside the wait's slice, 1 ns before it returns, never before the start
            end = max(w.end_ns - 1, w.start_ns, source.start_ns)
            events.append(
                common | {"ph": "s", "tid": tid[source.stream], "ts": us(source.start_ns)}
            )
            events.append(common | {"ph": "f", "bp": "e", "tid": tid[w.stream], "ts": us(end)})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """Write :meth:`chrome_trace` as JSON; return the path."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return os.fspath(path)

    def _layout(self, x0: float, plot_w: float) -> _Layout:
        calls, before = {}, 0
        for call, start, end in self.calls:
            calls[call] = (start, end, before)
            before += end - start
        return _Layout(x0, plot_w / max(before, 1), calls)

    def svg(self, width: int = 1200) -> str:
        """A Gantt chart of the profile: a lane per stream, the calls side by side (the time
        between them cut out), a time axis, a legend, ops named where they fit, waits hatched,
        an arrow from each record to the end of the wait it releases."""
        lanes = self.streams
        label_w = max(70, int(max(_text_px(_name(s), 12) for s in lanes)) + 12)
        plot_w = width - label_w - 30
        layout = self._layout(label_w, plot_w)
        top, pitch = 44, 30
        axis_y = top + pitch * len(lanes) + 2
        legend, legend_h = _legend(lanes, width, axis_y + 40)
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{axis_y + 40 + legend_h}" font-family="sans-serif" font-size="11">',
            _DEFS,
            f'<rect width="{width}" height="{axis_y + 40 + legend_h}" fill="#fff"/>',
            f'<text class="title" x="4" y="16" font-size="13">airstream timeline: '
            f"{len(self.calls)} call(s), wall {self.wall_ns / 1e3:.1f} us "
            "(the calls side by side, the time between them cut out)</text>",
        ]
        for i, label in enumerate(lanes):
            parts += self._svg_lane(label, i, layout, top + i * pitch, plot_w)
        parts += self._svg_calls(layout, top - 16, axis_y)
        parts += _axis(self.wall_ns, layout, axis_y, plot_w)
        parts += self._svg_flows(layout, {label: top + i * pitch for i, label in enumerate(lanes)})
        parts += legend
        parts.append("</svg>")
        return "\n".join(parts)

    def _svg_lane(
        self, label: str | None, index: int, layout: _Layout, y: int, plot_w: float
    ) -> list[str]:
        """One stream's lane: its waits (hatched), records (ticks) and ops (named if wide)."""
        name, colour = escape(_name(label)), _PALETTE[index % len(_PALETTE)]
        parts = [
            f'<g class="lane" data-stream="{name}">',
            f'<text x="4" y="{y + 18}" font-weight="bold">{name}</text>',
            f'<rect x="{layout.x0}" y="{y}" width="{plot_w:.2f}" height="28" fill="{_IDLE}"/>',
        ]
        for w in (w for w in self.waits if w.stream == label):
            x, wide = layout.x(w.call, w.start_ns), layout.width(w.call, w.start_ns, w.end_ns)
            tip = f"wait e{w.event}: blocked {(w.end_ns - w.start_ns) / 1e3:.1f} us"
            parts.append(
                f'<rect class="wait" {_ids(w)} x="{x:.2f}" y="{y + 3}" width="{max(wide, 1):.2f}" '
                f'height="22" fill="url(#blocked)" stroke="#777" stroke-width="0.5">'
                f"<title>{tip}</title></rect>"
            )
            parts += _bar_text(f"wait e{w.event}", x, wide, y, "#222", "wait-name")
        for r in (r for r in self.events if r.stream == label):
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
        for s in (s for s in self.records if s.stream == label):
            x = layout.x(s.call, s.start_ns)
            parts.append(
                f'<rect class="record" {_ids(s)} x="{x:.2f}" y="{y + 1}" width="2" height="26" '
                f'fill="#222"><title>record e{s.event}</title></rect>'
            )
        parts.append("</g>")
        return parts

    def _svg_calls(self, layout: _Layout, y: int, bottom: int) -> list[str]:
        """A thin separator at the start of each call and its "call N" label."""
        parts = []
        for n, (call, start, end) in enumerate(self.calls, 1):
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

    def _svg_flows(self, layout: _Layout, lane_y: dict[str | None, int]) -> list[str]:
        """An arrow from each record's start to the end of the wait it releases, from the edge
        of the record's bar to the facing edge of the wait's (along the gap between lanes)."""
        parts = []
        for source, w in self.flows():
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

    def export_svg(self, path: str | os.PathLike[str]) -> str:
        """Write :meth:`svg`; return the path."""
        with open(path, "w") as f:
            f.write(self.svg())
        return os.fspath(path)


_DEFS = (
    "<defs>"
    '<pattern id="blocked" patternUnits="userSpaceOnUse" width="6" height="6" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#d9d9d9"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#888" stroke-width="2"/></pattern>'
    '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
    'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c00"/>'
    "</marker></defs>"
)


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
            f"{_name(label)}: running an op",
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


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Record every compiled call made inside the block (from any thread)."""
    prof = Profile()
    add_listener(prof._add)
    try:
        yield prof
    finally:
        remove_listener(prof._add)
