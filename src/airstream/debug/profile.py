"""``airstream.profile()``: a per-stream timeline of compiled calls.

    with airstream.profile() as prof:
        compiled(x)
    print(prof.summary())
    prof.export_chrome_trace("trace.json")   # Perfetto / chrome://tracing: a track per stream
    prof.export_svg("timeline.svg")          # a Gantt chart, a lane per stream

Times are host times from ``time.perf_counter_ns``: on CPU they are when each op ran; on CUDA
they are when each op was issued (kernels run later, asynchronously). A call's clock starts once
its code is ready (the first profiled call generates the traced code before it starts).
The SVG chart is drawn by :mod:`airstream.debug.timeline_svg`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from airstream.debug.report import stream_name
from airstream.debug.timeline_svg import render_svg
from airstream.runtime.trace import (
    CallTrace,
    OpRecord,
    SyncRecord,
    add_listener,
    remove_listener,
)

__all__ = ["Profile", "StreamStats", "profile"]

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


def _union_ns(spans: list[tuple[int, int]]) -> int:
    """Total length covered by the ``(start, end)`` spans (times >= 0)."""
    total, reach = 0, 0
    for start, end in sorted(spans):
        total += max(0, end - max(start, reach))
        reach = max(reach, end)
    return total


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
                f"{stream_name(label):<16}{ops:>6}{s.busy_ns / 1e3:>11.1f}"
                f"{s.blocked_ns / 1e3:>12.1f}{s.idle_ns / 1e3:>10.1f}"
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
                meta | {"name": "thread_name", "args": {"name": f"stream {stream_name(label)}"}}
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

    def svg(self, width: int = 1200) -> str:
        """A Gantt chart of the profile: a lane per stream, the calls side by side (the time
        between them cut out), a time axis, a legend, ops named where they fit, waits hatched,
        an arrow from each record to the end of the wait it releases."""
        return render_svg(self, width)

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
