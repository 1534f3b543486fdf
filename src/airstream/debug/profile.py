"""``airstream.profile()``: a per-stream timeline of compiled calls.

    with airstream.profile() as prof:
        compiled(x)
    print(prof.summary())
    prof.export_chrome_trace("trace.json")   # Perfetto / chrome://tracing: a track per stream
    prof.export_svg("timeline.svg")          # a Gantt chart, a lane per stream

Times are host times from ``time.perf_counter_ns``: on CPU they are when each op ran; on CUDA
they are when each op was issued (kernels run later, asynchronously).
"""

from __future__ import annotations

import contextlib
import json
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


def _name(label: str | None) -> str:
    return "main" if label is None else label


@dataclass(frozen=True)
class StreamStats:
    """Per stream, over all profiled calls: time running ops, blocked in waits, and idle."""

    busy_ns: int
    blocked_ns: int
    idle_ns: int


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
        """Stream labels seen, main first."""
        labels: dict[str | None, None] = {None: None}
        for r in self.events:
            labels.setdefault(r.stream, None)
        return list(labels)

    @property
    def wall_ns(self) -> int:
        """Total wall time of the profiled calls."""
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

    def overlap(self) -> float:
        """Sum of stream busy time over wall time (1.0 = no overlap at all)."""
        wall = self.wall_ns
        return sum(s.busy_ns for s in self.stats().values()) / wall if wall else 0.0

    def summary(self) -> str:
        """Per stream: busy, blocked and idle time; then the overlap achieved."""
        lines = [
            f"{len(self.calls)} call(s), {len(self.events)} ops, wall {self.wall_ns / 1e3:.1f} us",
            f"{'stream':<16}{'ops':>6}{'busy us':>11}{'blocked us':>12}{'idle us':>10}",
        ]
        for label, s in self.stats().items():
            ops = sum(1 for r in self.events if r.stream == label)
            lines.append(
                f"{_name(label):<16}{ops:>6}{s.busy_ns / 1e3:>11.1f}{s.blocked_ns / 1e3:>12.1f}"
                f"{s.idle_ns / 1e3:>10.1f}"
            )
        lines.append(f"overlap (sum of busy / wall): {self.overlap():.2f}")
        segments = {r.name: r.detail for r in self.events if r.detail}
        if segments:  # max-autotune: what each segment step is
            lines.append("segments (max-autotune):")
            lines += [f"  {detail}" for detail in segments.values()]
        return "\n".join(lines)

    def _origin(self) -> int:
        return min((start for _, start, _ in self.calls), default=0)

    def chrome_trace(self) -> dict[str, Any]:
        """The profile in the Trace Event format: a track per stream, flows record -> wait."""
        origin = self._origin()
        tid = {label: i + 1 for i, label in enumerate(self.streams)}

        def us(ns: int) -> float:
            return (ns - origin) / 1e3

        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "airstream"}}
        ]
        for label, t in tid.items():
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": 1,
                    "tid": t,
                    "args": {"name": f"stream {_name(label)}"},
                }
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": 1,
                    "tid": t,
                    "args": {"sort_index": t},
                }
            )
        for r in self.events:
            events.append(
                {
                    "ph": "X",
                    "cat": "op",
                    "name": r.name,
                    "pid": 1,
                    "tid": tid[r.stream],
                    "ts": us(r.start_ns),
                    "dur": max((r.end_ns - r.start_ns) / 1e3, 0.001),
                    "args": {"call": r.call, "thread": r.thread}
                    | ({"segment": r.detail} if r.detail else {}),
                }
            )
        recorded: dict[tuple[int, int], SyncRecord] = {}
        for s in self.records:
            tid.setdefault(s.stream, len(tid) + 1)
            recorded[(s.call, s.event)] = s
            events.append(
                {
                    "ph": "X",
                    "cat": "record",
                    "name": f"record e{s.event}",
                    "pid": 1,
                    "tid": tid[s.stream],
                    "ts": us(s.start_ns),
                    "dur": max((s.end_ns - s.start_ns) / 1e3, 0.001),
                    "args": {"call": s.call},
                }
            )
        for flow_id, w in enumerate(self.waits):
            tid.setdefault(w.stream, len(tid) + 1)
            events.append(
                {
                    "ph": "X",
                    "cat": "wait",
                    "name": f"wait e{w.event}",
                    "pid": 1,
                    "tid": tid[w.stream],
                    "ts": us(w.start_ns),
                    "dur": max((w.end_ns - w.start_ns) / 1e3, 0.001),
                    "args": {"call": w.call, "blocked_us": (w.end_ns - w.start_ns) / 1e3},
                }
            )
            source = recorded.get((w.call, w.event))
            if source is not None:
                common = {"cat": "sync", "name": f"e{w.event}", "id": flow_id, "pid": 1}
                events.append(
                    {**common, "ph": "s", "tid": tid[source.stream], "ts": us(source.start_ns)}
                )
                events.append(
                    {**common, "ph": "f", "bp": "e", "tid": tid[w.stream], "ts": us(w.start_ns)}
                )
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """Write :meth:`chrome_trace` as JSON; return the path."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return os.fspath(path)

    def svg(self, width: int = 1000) -> str:
        """A Gantt chart of the profile: a lane per stream, ops coloured, waits grey."""
        origin = self._origin()
        end = max((e for _, _, e in self.calls), default=origin + 1)
        span = max(end - origin, 1)
        lanes = self.streams
        lane_h, label_w, top = 28, 90, 24
        height = top + lane_h * len(lanes) + 20
        scale = (width - label_w - 10) / span

        def x(ns: int) -> float:
            return label_w + (ns - origin) * scale

        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">',
            f'<text x="4" y="14">airstream timeline: {len(self.calls)} call(s), '
            f"{span / 1e3:.1f} us</text>",
        ]
        for i, label in enumerate(lanes):
            y = top + i * lane_h
            parts.append(f'<g class="lane" data-stream="{escape(_name(label))}">')
            parts.append(f'<text x="4" y="{y + 17}">{escape(_name(label))}</text>')
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{width - label_w - 10}" height="{lane_h - 4}"'
                ' fill="#f4f4f4"/>'
            )
            colour = _PALETTE[i % len(_PALETTE)]
            for w in (w for w in self.waits if w.stream == label):
                parts.append(
                    f'<rect x="{x(w.start_ns):.2f}" y="{y + 2}" '
                    f'width="{max((w.end_ns - w.start_ns) * scale, 0.5):.2f}" '
                    f'height="{lane_h - 8}" fill="#bbbbbb"><title>wait e{w.event}: '
                    f"{(w.end_ns - w.start_ns) / 1e3:.1f} us blocked</title></rect>"
                )
            for r in (r for r in self.events if r.stream == label):
                parts.append(
                    f'<rect x="{x(r.start_ns):.2f}" y="{y + 2}" '
                    f'width="{max((r.end_ns - r.start_ns) * scale, 0.5):.2f}" '
                    f'height="{lane_h - 8}" fill="{colour}"><title>{escape(r.name)}: '
                    f"{(r.end_ns - r.start_ns) / 1e3:.1f} us"
                    f"{escape(chr(10) + r.detail) if r.detail else ''}</title></rect>"
                )
            parts.append("</g>")
        parts.append("</svg>")
        return "\n".join(parts)

    def export_svg(self, path: str | os.PathLike[str]) -> str:
        """Write :meth:`svg`; return the path."""
        with open(path, "w") as f:
            f.write(self.svg())
        return os.fspath(path)


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Record every compiled call made inside the block (from any thread)."""
    prof = Profile()
    add_listener(prof._add)
    try:
        yield prof
    finally:
        remove_listener(prof._add)
