"""``airstream.explain(model, *inputs)``: compile without running, and say what was decided.

The report holds, per compiled graph, the graph after each pipeline stage (each node with its
stream), the plan and its summary, warnings (a stream whose work looks too small to pay for a
thread handoff, a graph break, streams that ended up empty) and the dump files written.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.backend import AirstreamBackend, CompiledGraph
from airstream.debug.observers import CompileObserver
from airstream.debug.report import format_segments, format_streams
from airstream.graph.nodes import AUTO_STREAMS_KEY
from airstream.graph.streams import StreamAssignment, assign_streams
from airstream.options.config import CompilerConfig
from airstream.passes.auto.microbatch import REFUSED_KEY, UNSPLIT_KEY, MicrobatchSplit
from airstream.passes.manager import PassSpec
from airstream.runtime.cuda_graphs import capture_statuses
from airstream.runtime.measured import Measurements

__all__ = ["ExplainReport", "GraphReport", "explain", "small_stream_warnings"]

# A side stream whose ops produce fewer elements than this is unlikely to pay for a handoff
# (tens of microseconds on CPU, see `airstream bench overhead`).
SMALL_STREAM_ELEMENTS = 1 << 16


@dataclass
class GraphReport:
    """What happened to one compiled graph."""

    kind: str
    stages: list[tuple[str, str]] = field(default_factory=list)  # (stage, graph text)
    compiled: CompiledGraph | None = None
    mode: str = "reduce-overhead"


@dataclass
class ExplainReport:
    """The result of :func:`explain`; ``str(report)`` is the readable form."""

    graphs: list[GraphReport]
    warnings: list[str]
    dumps: list[str]
    graph_breaks: int  # 0, or 1 when the model has at least one break

    def __str__(self) -> str:
        out = io.StringIO()
        breaks = "a graph break" if self.graph_breaks else "no graph break"
        out.write(f"airstream explain: {len(self.graphs)} graph(s) compiled, {breaks}\n")
        for i, graph in enumerate(self.graphs):
            for stage, text in graph.stages:
                out.write(f"\n== graph {i} ({graph.kind}) {stage} ==\n{text}\n")
            if graph.compiled is not None:
                out.write(f"\n== graph {i} ({graph.kind}) plan ==\n{graph.compiled.plan}\n")
                out.write(graph.compiled.plan.summary() + "\n")
                out.write(f"executor: {type(graph.compiled.executor).__name__}\n")
                for status in capture_statuses(graph.compiled.executor):
                    out.write(f"cuda graph: {status}\n")
                out.write(f"mode: {graph.mode}\n")
                if graph.compiled.segments or graph.mode == "max-autotune":
                    out.write(f"\n== graph {i} ({graph.kind}) max-autotune segments ==\n")
                    out.write(format_segments(graph.compiled.segments) + "\n")
                decision = graph.compiled.graph_module.meta.get(AUTO_STREAMS_KEY)
                if decision is not None:
                    out.write(f"{decision}\n")
                split = _microbatch_text(graph.compiled.graph_module)
                if split:
                    out.write(f"{split}\n")
                measured = graph.compiled.measurements
                if measured is not None:
                    out.write(_measured_text(measured) + "\n")
        out.write("\n== warnings ==\n")
        out.write("".join(f"- {w}\n" for w in self.warnings) or "none\n")
        if self.dumps:
            out.write("\n== dumps written ==\n" + "".join(f"{p}\n" for p in self.dumps))
        return out.getvalue()


def _microbatch_text(gm: torch.fx.GraphModule) -> str:
    """What microbatch_overlap did to the graph (nothing where it did not run on it)."""
    split = gm.meta.get(UNSPLIT_KEY)
    if isinstance(split, MicrobatchSplit):
        return f"microbatch_overlap: {split.describe()}"
    refused = gm.meta.get(REFUSED_KEY)
    return f"microbatch_overlap: unsplit: {refused}" if refused else ""


def _measured_text(measured: Measurements) -> str:
    """measure_placement's part of a graph's report: over what, and each range's decision."""
    over = f" per size range of {measured.sizes}" if measured.sizes else ""
    lines = "".join(f"\n  {line}" for line in measured.describe().splitlines())
    return f"measure_placement: one stream and the placement timed in turn{over}:{lines}"


def _text(gm: torch.fx.GraphModule) -> str:
    try:
        streams: StreamAssignment | None = assign_streams(gm)
    except Exception:  # half-built scopes between stages: show the plain graph
        streams = None
    return format_streams(gm, streams) if streams is not None else gm.code.strip()


class _Recorder(CompileObserver):
    def __init__(self, reports: list[GraphReport]) -> None:
        self.reports = reports

    def started(self, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self.reports.append(GraphReport(graph_kind, [("after AOTAutograd", _text(gm))]))

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        pass

    def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self.reports[-1].stages.append((f"after {stage}", _text(gm)))


def small_stream_warnings(compiled: CompiledGraph) -> list[str]:
    """Warn about side streams whose work is probably smaller than a handoff costs."""
    out = []
    for program in compiled.plan.side_streams:
        runs = program.runs
        if not runs:
            out.append(f"{compiled.kind} graph: stream {program.label!r} has no ops")
            continue
        elements = 0
        for node in runs:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                numel = val.numel()
                elements += int(numel) if isinstance(numel, int) else SMALL_STREAM_ELEMENTS
        if elements < SMALL_STREAM_ELEMENTS:
            out.append(
                f"{compiled.kind} graph: stream {program.label!r} runs {len(runs)} op(s) "
                f"producing {elements} elements; that is likely less work than handing it to "
                "another thread costs (tens of us on CPU): keep it on the main stream"
            )
    return out


class _CompileOnly(Exception):
    pass


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise _CompileOnly


def explain(
    model: Callable[..., Any],
    *example_inputs: Any,
    compiler_config: CompilerConfig | None = None,
    **kw: Any,
) -> ExplainReport:
    """Compile ``model`` for ``example_inputs`` with airstream without running it; report.

    Compiles the inference graph (under ``torch.no_grad``); nothing runs: the compiled graph is
    replaced by a stub that stops the call. A model with a graph break is reported as such (found
    by tracing with ``fullgraph=True``) and only its first graph is compiled, since later ones
    would need the first one's real outputs (if Dynamo gives up on the whole frame instead, as
    for a break inside ``airstream.stream``, that frame runs eagerly once and no graph is
    compiled). Extra keyword arguments go to ``torch.compile``.
    Dynamo's cache for ``model`` is cleared afterwards, so a later ``torch.compile`` of it
    compiles afresh.
    """
    config = compiler_config if compiler_config is not None else CompilerConfig()
    torch_internals.require("explain")
    graph_break: str | None = None
    try:
        backend, reports = _compile_only(model, example_inputs, config, fullgraph=True, **kw)
    except torch_internals.dynamo_unsupported() as exc:  # a graph break, found while tracing
        graph_break = str(exc).strip().splitlines()[0]
        backend, reports = _compile_only(model, example_inputs, config, fullgraph=False, **kw)
    for report, graph in zip(reports, backend.graphs, strict=False):
        report.compiled = graph
        report.mode = graph.mode  # as compiled: "default" resolved by the graph's device
    warnings_: list[str] = []
    for graph in backend.graphs:
        warnings_ += small_stream_warnings(graph)
    if graph_break is not None:
        warnings_.append(
            f"the model has a graph break ({graph_break}); only the graph before it is "
            "explained, and no stream can span it (compile with fullgraph=True to see where)"
        )
    dumps = [path for dumper in backend.dumpers for path in dumper.written]
    return ExplainReport(reports, warnings_, dumps, 0 if graph_break is None else 1)


def _compile_only(
    model: Callable[..., Any],
    example_inputs: Sequence[Any],
    config: CompilerConfig,
    **compile_kwargs: Any,
) -> tuple[AirstreamBackend, list[GraphReport]]:
    reports: list[GraphReport] = []
    backend = AirstreamBackend(config, observers=[_Recorder(reports)])

    def compile_only(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
        backend(gm, inputs)
        return _stop

    compiled = torch.compile(model, backend=compile_only, **compile_kwargs)
    try:
        with torch.no_grad(), contextlib.suppress(_CompileOnly):
            compiled(*example_inputs)
    finally:
        torch_internals.remove_from_dynamo_cache(model)
    return backend, reports
