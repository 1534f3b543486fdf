"""The profile's timeline: SVG layout, axis, legend, names, waits, flow arrows, summary words."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
import torch
from tests.conftest import compile_model, graph_of

import airstream
from airstream.debug.profile import Profile
from airstream.examples.guide import Model, custom_pre_pass
from airstream.runtime import trace
from airstream.runtime.trace import CallTrace, OpRecord, SyncRecord

SVG = "{http://www.w3.org/2000/svg}"
# Two calls 100 us and 300 us long, 49.9 ms apart: the gap must not be drawn.
CALLS = ((7, 1_000_000, 100_000), (8, 51_000_000, 300_000))  # (id, start ns, length ns)


def _call(call: int, start: int, length: int) -> CallTrace:
    """One call: main runs a long op, waits on e0 (recorded by s1 after its mm), adds, and
    runs an op too short to name."""

    def op(stream: str | None, name: str, begin: int, end: int) -> OpRecord:
        return OpRecord(stream, name, start + begin, start + end, call, "t")

    def sync(kind: str, stream: str | None, begin: int, end: int) -> SyncRecord:
        return SyncRecord(kind, stream, 0, start + begin, start + end, call)

    scale = length // 100_000
    ms = [x * scale for x in (5_000, 10_000, 60_000, 70_000, 72_000, 80_000, 90_000, 95_000)]
    return CallTrace(
        call=call,
        start_ns=start,
        end_ns=start + length,
        ops=[
            op(None, "linear_long_name", ms[1], ms[2]),
            op(None, "add", ms[5], ms[6]),
            op(None, "tiny_op_name", ms[7], ms[7] + 100 * scale),
            op("s1", "mm", ms[0], ms[3]),
        ],
        syncs=[sync("wait", None, ms[2], ms[5]), sync("record", "s1", ms[3], ms[4])],
    )


def _profile() -> Profile:
    prof = Profile()
    for call, start, length in CALLS:
        prof._add(_call(call, start, length))
    return prof


def _svg(prof: Profile) -> ET.Element:
    return ET.fromstring(prof.svg())


def _all(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(SVG + tag) if e.get("class") == cls]


def _f(element: ET.Element, attr: str) -> float:
    return float(element.get(attr, "nan"))


def _plot(root: ET.Element) -> tuple[float, float]:
    """The axis line's x extent: where the first call starts and the last one ends."""
    axis = _all(root, "g", "axis")[0]
    line = next(e for e in axis.iter(SVG + "line") if e.get("class") is None)
    return _f(line, "x1"), _f(line, "x2")


def test_calls_are_drawn_side_by_side_with_the_gaps_cut_out() -> None:
    root = _svg(_profile())
    x0, x1 = _plot(root)
    separators = [_f(e, "x1") for e in _all(root, "line", "call-separator")]
    # 100 us then 300 us: the second call starts a quarter of the way, not at 49.9 / 50.3
    assert separators == pytest.approx([x0, x0 + (x1 - x0) / 4], abs=0.02)
    labels = [e.text for e in _all(root, "text", "call-label")]
    assert labels == ["call 1", "call 2"]
    ops = _all(root, "rect", "op")
    assert min(_f(r, "x") for r in ops) >= x0
    assert max(_f(r, "x") + _f(r, "width") for r in ops) <= x1 + 0.01
    # the second call's mm starts 5% into its 300 us, drawn at 25% + 0.75 * 5% of the plot
    mm = [r for r in ops if r.findtext(SVG + "title", "").startswith("mm:")]
    assert _f(mm[1], "x") == pytest.approx(x0 + (x1 - x0) * (0.25 + 0.75 * 0.05), abs=0.02)


def test_time_axis_has_evenly_spaced_ticks_in_us_or_ms() -> None:
    prof = _profile()
    root = _svg(prof)
    x0, x1 = _plot(root)
    ticks = _all(root, "line", "tick")
    ns = [int(t.get("data-ns", "-1")) for t in ticks]
    step = ns[1] - ns[0]
    assert ns[0] == 0 and len(ns) >= 3 and ns[-1] <= prof.wall_ns < ns[-1] + step
    assert ns == list(range(0, ns[-1] + 1, step))
    assert re.fullmatch(r"[125]0*", str(step)), step
    for tick, t in zip(ticks, ns, strict=True):
        assert _f(tick, "x1") == pytest.approx(x0 + (x1 - x0) * t / prof.wall_ns, abs=0.02)
    labels = [e.text or "" for e in _all(root, "text", "tick-label")]
    assert labels[0] == "0" and all(re.fullmatch(r"[\d.]+ (us|ms)", s) for s in labels[1:])
    assert labels[1] == "50 us"  # 400 us over about 1100 px: a tick every 50 us


def test_tick_labels_switch_to_ms_for_long_profiles() -> None:
    prof = Profile()
    prof._add(_call(9, 0, 40_000_000))  # 40 ms
    labels = [e.text or "" for e in _all(_svg(prof), "text", "tick-label")]
    assert labels[1:3] == ["5 ms", "10 ms"]


def test_legend_names_each_stream_colour_waits_and_arrows() -> None:
    root = _svg(_profile())
    legend = _all(root, "g", "legend")[0]
    items = {e.findtext(SVG + "text", ""): e[0] for e in legend if e.get("class") == "legend-item"}
    lanes = {g.get("data-stream"): g for g in _all(root, "g", "lane")}
    for stream in ("main", "s1"):
        colour = items[f"{stream}: running an op"].get("fill")
        fills = {r.get("fill") for r in lanes[stream].iter(SVG + "rect") if r.get("class") == "op"}
        assert fills == {colour}, "the legend's colour is the lane's"
    blocked = next(glyph for text, glyph in items.items() if text.startswith("blocked in a wait"))
    assert blocked.get("fill") == "url(#blocked)"
    assert any(text.startswith("idle") for text in items)
    assert any("record" in text and "wait" in text for text in items)


def test_op_names_are_written_on_bars_wide_enough_to_hold_them() -> None:
    root = _svg(_profile())
    names = _all(root, "text", "op-name")
    assert {e.text for e in names} == {"linear_long_name", "add", "mm"}
    ops = {r.findtext(SVG + "title", "").split(":")[0]: r for r in _all(root, "rect", "op")}
    assert "tiny_op_name" in ops, "too narrow to name: a tooltip only"
    for text in names:
        bar = next(
            r
            for r in _all(root, "rect", "op")
            if r.findtext(SVG + "title", "").startswith(f"{text.text}:")
            and _f(r, "x") <= _f(text, "x") < _f(r, "x") + _f(r, "width")
        )
        assert len(text.text or "") * 5 < _f(bar, "width")


def test_waits_are_hatched_blocks_with_their_event() -> None:
    root = _svg(_profile())
    pattern = next(e for e in root.iter(SVG + "pattern") if e.get("id") == "blocked")
    assert pattern.find(SVG + "line") is not None, "hatched"
    waits = _all(root, "rect", "wait")
    assert len(waits) == 2 and all(w.get("fill") == "url(#blocked)" for w in waits)
    x0, x1 = _plot(root)
    # each wait blocks 20% of its call (60% -> 80%); the calls take 1/4 and 3/4 of the plot
    widths = [_f(w, "width") / (x1 - x0) for w in waits]
    assert widths == pytest.approx([0.2 * 0.25, 0.2 * 0.75], abs=1e-4)
    assert "wait e0" in {e.text for e in _all(root, "text", "wait-name")}


def test_flow_arrows_run_forwards_from_record_to_the_end_of_its_wait() -> None:
    root = _svg(_profile())
    records = {(e.get("data-call"), e.get("data-event")): e for e in _all(root, "rect", "record")}
    waits = {(e.get("data-call"), e.get("data-event")): e for e in _all(root, "rect", "wait")}
    flows = _all(root, "line", "flow")
    assert len(flows) == 2
    lanes = {g.get("data-stream"): g for g in _all(root, "g", "lane")}
    s1_top = _f(next(lanes["s1"].iter(SVG + "rect")), "y")  # the lane's background
    for flow in flows:
        key = (flow.get("data-call"), flow.get("data-event"))
        record, wait = records[key], waits[key]
        assert _f(flow, "x1") == pytest.approx(_f(record, "x") + 1, abs=0.02)
        assert _f(flow, "x2") == pytest.approx(_f(wait, "x") + _f(wait, "width"), abs=0.02)
        assert _f(flow, "x2") > _f(flow, "x1"), "forwards in time"
        assert _f(flow, "x1") > _f(wait, "x"), "the wait began before the record was made"
        assert _f(flow, "y1") > s1_top > _f(flow, "y2"), "from s1's lane up to main's"


def test_a_wait_that_returned_before_its_record_gets_no_arrow() -> None:
    prof = Profile()
    call = _call(9, 0, 100_000)
    call.syncs = [SyncRecord("wait", None, 0, 1_000, 2_000, 9), *call.syncs[1:]]
    prof._add(call)
    assert prof.flows() == []
    assert _all(_svg(prof), "line", "flow") == []
    assert not [e for e in prof.chrome_trace()["traceEvents"] if e["ph"] in "sf"]


def test_chrome_trace_flows_start_at_the_record_and_end_in_the_wait_later() -> None:
    prof = _profile()
    events = prof.chrome_trace()["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == 2 and set(starts) == set(ends)
    for flow_id, start in starts.items():
        end = ends[flow_id]
        record = next(e for e in slices if e["cat"] == "record" and e["ts"] == start["ts"])
        wait = next(
            e
            for e in slices
            if e["cat"] == "wait"
            and e["ts"] <= end["ts"] <= e["ts"] + e["dur"]
            and e["args"]["call"] == record["args"]["call"]
        )
        assert start["tid"] == record["tid"] and end["tid"] == wait["tid"]
        assert end["bp"] == "e"
        assert end["ts"] >= start["ts"], "forwards in time"
        assert end["ts"] == pytest.approx(wait["ts"] + wait["dur"], abs=0.0011), "at its end"


def test_title_total_equals_summary_wall() -> None:
    prof = _profile()
    title = _svg(prof).findtext(SVG + "text", "")  # the first text: the title
    wall = re.search(r"wall ([\d.]+) us", prof.summary())
    assert wall and wall.group(1) == "400.0"
    assert f"wall {wall.group(1)} us" in title


def test_summary_explains_its_figures_and_overlap_counts_busy_time_only() -> None:
    prof = _profile()
    # busy per call: main 50 + 10 + 0.1 %, s1 65 %; some op ran during 65 + 10 + 0.1 %
    assert prof.overlap() == pytest.approx(125.1 / 75.1)
    assert prof.any_busy_ns() == pytest.approx(0.751 * prof.wall_ns)
    summary = prof.summary()
    assert "streams busy at once: 1.67" in summary
    assert "1.00 = the streams' work" in summary and "never overlapped" in summary
    assert "2.00 = both streams busy the whole time" in summary
    assert "some stream running an op: 75% of the wall" in summary
    idle = summary[summary.index("idle: neither") :]
    assert "Python" in idle and "before its first op" in idle


def _guide(run_eagerly: bool) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    config.debug.run_eagerly = run_eagerly
    return config


def _lazies(executor: Any) -> list[Any]:
    """The LazyTraced objects of an executor (serial, or CPU: main and side streams)."""
    if hasattr(executor, "_traced"):
        return [executor._traced]
    return [executor.main.traced, *(stream.traced for _, stream in executor.sides)]


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["cpu", "serial"])
def test_a_call_clock_starts_once_its_traced_code_is_ready(
    run_eagerly: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, backend = compile_model(Model(), _guide(run_eagerly))
    x = torch.randn(16, 16)
    compiled(x)
    lazies = _lazies(graph_of(backend, "inference").executor)
    assert lazies and not any(lazy.built for lazy in lazies)
    ready: list[int] = []
    for lazy in lazies:
        build = lazy._build
        monkeypatch.setattr(lazy, "_build", lambda b=build: (b(), ready.append(trace.now_ns()))[0])
    with airstream.profile() as prof:
        compiled(x)
    assert len(ready) == len(lazies) and len(prof.calls) == 1
    assert prof.calls[0][1] >= max(ready), "the code generation is not part of the call"


def test_real_profile_waits_return_after_their_records_and_arrows_point_forwards() -> None:
    compiled, _ = compile_model(Model(), _guide(False))
    x = torch.randn(32, 32)
    compiled(x)
    with airstream.profile() as prof:
        for _ in range(3):
            compiled(x)
    pairs = prof.flows()
    assert len(pairs) == len(prof.waits) >= 3, "every wait has its record"
    assert all(w.end_ns >= r.start_ns for r, w in pairs)
    flows = _all(_svg(prof), "line", "flow")
    assert len(flows) == len(pairs) and all(_f(f, "x2") >= _f(f, "x1") - 1 for f in flows)
    events = prof.chrome_trace()["traceEvents"]
    starts = {e["id"]: e["ts"] for e in events if e["ph"] == "s"}
    assert all(e["ts"] >= starts[e["id"]] for e in events if e["ph"] == "f")
