"""CUDA runtime: one ``torch.cuda.Stream`` per label, ``torch.cuda.Event`` per sync, one thread.

The plan's steps are issued from the calling thread in ``plan.sequence`` order (each stream's order,
every record before its waits) as one FX-generated function. Side streams are forked from the
caller's current stream (they wait on an event recorded there first) and joined back (the plan's
join: the caller's stream waits for each side stream's last step). A tensor used on a stream other
than the one that made it (graph inputs and outputs included) gets ``record_stream`` for the
consumer, so the caching allocator never hands its memory out while that stream may still read it.

``CudaGraphExecutor`` (``mode="reduce-overhead"``) captures the whole multi-stream call into a CUDA
graph on first use (the fork/join shape is what makes multi-stream capture legal) and replays it,
copying inputs into static buffers and cloning outputs (a replay is one opaque launch: profiling
sees no per-op records for it; use ``mode="max-autotune"`` to profile streams). It falls back to
the plain stream executor for graphs it cannot capture safely: symbolic shapes, mutated inputs,
random ops, non-CUDA inputs.
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream.ops.library import wait_tensor
from airstream.runtime.codegen import emit_op
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.schedule.plan import Record, Run, StreamPlan, Wait
from airstream.torch_internals import op_schema

__all__ = ["CudaExecutor", "CudaGraphExecutor", "capture_blockers", "stream_for"]

_streams: dict[tuple[int, str, int], Any] = {}
_streams_lock = threading.Lock()


def stream_for(device: torch.device, label: str, priority: int = 0) -> Any:
    """The process-wide CUDA stream of ``label`` on ``device`` (same label, same stream)."""
    key = (device.index or 0, label, priority)
    stream = _streams.get(key)
    if stream is None:
        with _streams_lock:
            stream = _streams.get(key)
            if stream is None:
                stream = _streams[key] = torch.cuda.Stream(device=device, priority=priority)
    return stream


def _use(streams: Sequence[Any], index: int) -> None:
    torch.cuda.set_stream(streams[index])


def _fork(streams: Sequence[Any], events: Sequence[Any], index: int) -> None:
    """Every side stream starts after the work already queued on the caller's stream."""
    events[index].record(streams[0])
    for stream in streams[1:]:
        stream.wait_event(events[index])


def _record(streams: Sequence[Any], index: int, events: Sequence[Any], event: int) -> None:
    events[event].record(streams[index])


def _wait(streams: Sequence[Any], index: int, events: Sequence[Any], event: int) -> None:
    streams[index].wait_event(events[event])


def _keep(value: Any, streams: Sequence[Any], index: int, tracking: bool) -> Any:
    """Tell the allocator ``value`` is in use on ``streams[index]`` (not needed in capture)."""
    if tracking and isinstance(value, torch.Tensor) and value.is_cuda:
        value.record_stream(streams[index])
    return value


def _generate(
    gm: torch.fx.GraphModule, plan: StreamPlan, traced: bool = False
) -> tuple[torch.fx.GraphModule, int]:
    """One function issuing every step; returns the module and the fork event's index.

    The traced variant takes a dict of StreamTraces and records host issue times per op."""
    labels = [s.label for s in plan.streams]  # main (None) first
    index_of = {label: i for i, label in enumerate(labels)}
    fork_event = max((s.event for s in plan.syncs), default=-1) + 1
    by_name = {n.name: n for n in gm.graph.nodes}
    producer: dict[torch.fx.Node, Any] = {
        by_name[name]: s.label for s in plan.streams for name in s.runs
    }
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    graph = torch.fx.Graph()
    args = graph.placeholder("args")
    streams = graph.placeholder("streams")
    events = graph.placeholder("events")
    tracking = graph.placeholder("tracking")
    traces = graph.placeholder("traces") if traced else None
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    kept: set[tuple[torch.fx.Node, Any]] = set()
    current: list[Any] = [None]

    def value_on(node: torch.fx.Node, label: Any) -> torch.fx.Node:
        if node not in env:
            if node.op == "placeholder":
                env[node] = graph.call_function(operator.getitem, (args, placeholders.index(node)))
            else:
                env[node] = graph.get_attr(str(node.target))
        source = producer.get(node)
        if node.op == "placeholder":
            source = None  # made on the caller's stream
        if source != label and (node, label) not in kept and node.op != "get_attr":
            kept.add((node, label))
            graph.call_function(_keep, (env[node], streams, index_of[label], tracking))
        return env[node]

    if len(labels) > 1:
        graph.call_function(_fork, (streams, events, fork_event))
    for label, step in plan.sequence:
        if isinstance(step, Run):
            node = by_name[step.node]
            if current[0] != label:
                graph.call_function(_use, (streams, index_of[label]))
                current[0] = label
            if node.target is wait_tensor:
                env[node] = value_on(node.args[0], label)
            else:
                trace = None
                if traces is not None:
                    trace = graph.call_function(operator.getitem, (traces, label))
                env[node] = emit_op(graph, node, lambda n, lb=label: value_on(n, lb), trace)
        elif isinstance(step, Record):
            graph.call_function(_record, (streams, index_of[label], events, step.event))
        elif isinstance(step, Wait):
            graph.call_function(_wait, (streams, index_of[label], events, step.event))
    if current[0] is not None:
        graph.call_function(_use, (streams, 0))
    output = next(iter(gm.graph.find_nodes(op="output")))
    graph.output(torch.fx.map_arg(output.args[0], lambda n: value_on(n, None)))
    name = "AirstreamCudaTraced" if traced else "AirstreamCuda"
    return torch.fx.GraphModule(gm, graph, class_name=name), fork_event


class CudaExecutor:
    """Boxed callable issuing a StreamPlan on CUDA streams from the calling thread."""

    def __init__(self, gm: torch.fx.GraphModule, plan: StreamPlan, device: torch.device) -> None:
        self._boxed_call = True
        self.plan = plan
        self.device = device
        self.module, fork_event = _generate(gm, plan)
        self._num_events = fork_event + 1
        self._fn = self.module.forward
        self._fn_traced = _generate(gm, plan, traced=True)[0].forward
        self._sides: list[Any] | None = None

    @property
    def code(self) -> str:
        """The generated code that issues every stream's work."""
        return self.module.code

    def _side_streams(self) -> list[Any]:
        if self._sides is None:
            self._sides = [
                stream_for(self.device, s.label, self.plan.priorities.get(s.label, 0))
                for s in self.plan.side_streams
            ]
        return self._sides

    def run(self, args: Sequence[Any], tracking: bool = True) -> Any:
        """Issue one call; ``tracking=False`` skips record_stream (inside graph capture)."""
        caller = torch.cuda.current_stream(self.device)
        streams = [caller, *self._side_streams()]
        events = [torch.cuda.Event() for _ in range(self._num_events)]
        trace = CallTrace() if tracking and tracing_wanted() else None
        try:
            if trace is None:
                return self._fn(args, streams, events, tracking)
            traces = {s.label: trace.stream(s.label) for s in self.plan.streams}
            return self._fn_traced(args, streams, events, tracking, traces)
        finally:
            torch.cuda.set_stream(caller)
            if trace is not None:
                trace.finish()

    def __call__(self, args: list[Any]) -> Any:
        return self.run(args)


def capture_blockers(gm: torch.fx.GraphModule) -> list[str]:
    """Why ``gm`` cannot be captured into a CUDA graph (empty if it can)."""
    reasons = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            if isinstance(val, torch.SymInt) or (
                isinstance(val, torch.Tensor)
                and any(isinstance(d, torch.SymInt) for d in val.shape)
            ):
                reasons.append(f"symbolic shape at input {node.name}")
            elif isinstance(val, torch.Tensor) and val.device.type != "cuda":
                reasons.append(f"input {node.name} is on {val.device}")
        elif node.op == "call_function" and (schema := op_schema(node.target)) is not None:
            if schema.is_mutable:
                reasons.append(f"{node.name} mutates its input")
            if torch.Tag.nondeterministic_seeded in node.target.tags:
                reasons.append(f"{node.name} draws random numbers")
    return reasons


class CudaGraphExecutor:
    """Captures a CudaExecutor's call into a CUDA graph on first use, then replays it."""

    def __init__(self, inner: CudaExecutor, gm: torch.fx.GraphModule, warmup: int = 2) -> None:
        self._boxed_call = True
        self.inner = inner
        self.blockers = capture_blockers(gm)
        self.warmup = warmup
        self._graph: Any = None
        self._static_inputs: list[Any] = []
        self._static_outputs: Any = None
        self._lock = threading.Lock()

    @property
    def code(self) -> str:
        """The generated code the graph was captured from."""
        return self.inner.code

    def _capture(self, args: Sequence[Any]) -> None:
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        side = torch.cuda.Stream(device=self.inner.device)
        side.wait_stream(torch.cuda.current_stream(self.inner.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.inner.run(static)
        torch.cuda.current_stream(self.inner.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.inner.run(static, tracking=False)
        self._graph, self._static_inputs, self._static_outputs = graph, static, outputs

    def __call__(self, args: list[Any]) -> Any:
        if self.blockers:
            return self.inner(args)
        with self._lock:  # one static buffer set: calls replay one at a time
            if self._graph is None:
                try:
                    self._capture(args)
                except Exception as exc:  # capture is an optimization: never fail the call
                    warnings.warn(
                        f"airstream: CUDA graph capture failed ({type(exc).__name__}: {exc}); "
                        "running this graph on streams without capture",
                        stacklevel=2,
                    )
                    self.blockers = [f"capture failed: {exc}"]
                    return self.inner(args)
            for static, arg in zip(self._static_inputs, args, strict=True):
                if isinstance(static, torch.Tensor):
                    static.copy_(arg)
            self._graph.replay()
            return tuple(
                o.clone() if isinstance(o, torch.Tensor) else o for o in self._static_outputs
            )
