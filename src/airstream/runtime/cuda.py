"""CUDA runtime: one ``torch.cuda.Stream`` per label, ``torch.cuda.Event`` per sync, one thread.

The plan's steps are issued from the calling thread in ``plan.sequence`` order (each stream's order,
every record before its waits) as one FX-generated function. Side streams are forked from the
caller's current stream (they wait on an event recorded there first) and joined back (the plan's
join: the caller's stream waits for each side stream's last step). A tensor used on a stream other
than the one that made it (graph inputs and outputs included) gets ``record_stream`` for the
consumer, so the caching allocator never hands its memory out while that stream may still read it.

``CudaGraphExecutor`` (``mode="reduce-overhead"``) captures the whole multi-stream call into a CUDA
graph on first use (the fork/join shape is what makes multi-stream capture legal) and replays it,
copying the inputs that change into static buffers (parameters and buffers are captured by
address) and cloning outputs (a replay is one opaque launch: profiling
sees no per-op records for it; use ``mode="max-autotune"`` to profile streams). It falls back to
the plain stream executor for graphs it cannot capture safely: symbolic shapes, mutated inputs,
random ops, non-CUDA inputs.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream.effects import effects
from airstream.runtime.codegen import (
    Builder,
    GeneratedCode,
    Hooks,
    Label,
    LazyTraced,
    generate,
    inputs_read,
)
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.schedule.plan import StreamPlan

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


class _IssueHooks(Hooks):
    """One function issues every stream's steps: stream switches, events, record_stream."""

    params = ("streams", "events", "tracking")

    def __init__(self, labels: Sequence[Label], plan: StreamPlan, fork_event: int) -> None:
        self.index_of = {label: i for i, label in enumerate(labels)}  # main (None) first
        self.producer = plan.stream_of()
        self.fork_event = fork_event
        self.current: Label = None

    def begin(self, b: Builder) -> None:
        if len(self.index_of) > 1:
            b.call(_fork, b.params["streams"], b.params["events"], self.fork_event)

    def switch(self, b: Builder, label: Label) -> None:
        b.call(_use, b.params["streams"], self.index_of[label])
        self.current = label

    def end(self, b: Builder) -> None:
        if self.current is not None:
            b.call(_use, b.params["streams"], 0)

    def record(self, b: Builder, label: Label, event: int) -> None:
        b.call(_record, b.params["streams"], self.index_of[label], b.params["events"], event)

    def wait(self, b: Builder, label: Label, event: int) -> None:
        b.call(_wait, b.params["streams"], self.index_of[label], b.params["events"], event)

    def first_use(
        self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node
    ) -> None:
        source = None if node.op == "placeholder" else self.producer.get(node)
        if source != label:  # made on another stream (inputs: on the caller's)
            p = b.params
            b.call(_keep, value, p["streams"], self.index_of[label], p["tracking"])


class CudaExecutor:
    """Boxed callable issuing a StreamPlan on CUDA streams from the calling thread."""

    def __init__(self, gm: torch.fx.GraphModule, plan: StreamPlan, device: torch.device) -> None:
        self._boxed_call = True
        self.plan = plan
        self.device = device
        self._fork_event = max((s.event for s in plan.syncs), default=-1) + 1
        self._num_events = self._fork_event + 1
        # Streams that run nothing are left out: forked but never joined, they would make a
        # CUDA graph capture fail, and a wait on them orders nothing.
        self._sides_used = [s.label for s in plan.side_streams if s.runs]
        labels = [None, *self._sides_used]
        steps = [(label, step) for label, step in plan.sequence if label in labels]
        inputs = inputs_read(gm, steps, returns=True)

        def build(traced: bool) -> GeneratedCode:
            return generate(
                gm,
                steps,
                inputs=inputs,
                hooks=_IssueHooks(labels, plan, self._fork_event),
                returns=True,
                traced=traced,
                name="AirstreamCuda",
            )

        generated = build(traced=False)
        self.module = generated.module
        self._fn = generated.fn
        self._traced = LazyTraced(lambda: build(traced=True).fn)
        self._sides: list[Any] | None = None

    @property
    def code(self) -> str:
        """The generated code that issues every stream's work."""
        return self.module.code

    def _side_streams(self) -> list[Any]:
        if self._sides is None:
            self._sides = [
                stream_for(self.device, str(label), self.plan.priorities.get(str(label), 0))
                for label in self._sides_used
            ]
        return self._sides

    def run(self, args: list[Any], tracking: bool = True) -> Any:
        """Issue one call (emptying ``args``); ``tracking=False`` skips record_stream (inside
        graph capture)."""
        caller = torch.cuda.current_stream(self.device)
        streams = [caller, *self._side_streams()]
        events = [torch.cuda.Event() for _ in range(self._num_events)]
        trace = CallTrace() if tracking and tracing_wanted() else None
        try:
            if trace is None:
                return self._fn(args, streams, events, tracking)
            traces = {s.label: trace.stream(s.label) for s in self.plan.streams}
            return self._traced.get()(args, streams, events, tracking, traces)
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
        elif node.op == "call_function":
            found = effects(node)
            if found.mutates:
                reasons.append(f"{node.name} mutates its input")
            if found.random:
                reasons.append(f"{node.name} draws random numbers")
    return reasons


class CudaGraphApi:
    """The CUDA calls graph capture makes, in one place so tests can stand in for them on CPU."""

    def graph(self) -> Any:
        """A new, empty graph to capture into."""
        return torch.cuda.CUDAGraph()

    def capture(self, graph: Any) -> Any:
        """Context manager: everything issued inside is captured into ``graph``."""
        return torch.cuda.graph(graph)

    def warmup_stream(self, device: torch.device) -> Any:
        """Context manager running the warm-up calls on a fresh stream, joined afterwards."""
        return _WarmupStream(device)


class _WarmupStream:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.context: Any = None

    def __enter__(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        self.context = torch.cuda.stream(self.stream)
        self.context.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.context.__exit__(*exc)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


class CudaGraphExecutor:
    """Captures a CudaExecutor's call into a CUDA graph on first use, then replays it.

    Parameters and buffers (``static``: their input indices, from AOTAutograd) are captured by
    address, as torch's cudagraph trees do: a replay reads them where they are, and only the
    other inputs are copied into the graph's own buffers. If a static input is a different tensor
    than at capture (a module's weights replaced by new tensors), the graph is captured again.
    """

    def __init__(
        self,
        inner: Any,
        gm: torch.fx.GraphModule,
        static: Sequence[int] = (),
        warmup: int = 2,
        api: CudaGraphApi | None = None,
    ) -> None:
        self._boxed_call = True
        self.inner = inner
        self.blockers = capture_blockers(gm)
        self.static = frozenset(static)
        self.warmup = warmup
        self.api = api or CudaGraphApi()
        self.captures = 0  # how many times a graph was captured (recaptures included)
        self._graph: Any = None
        self._inputs: list[Any] = []  # per input: the static tensor itself, or our buffer
        self._copies: list[tuple[int, torch.Tensor]] = []  # (input index, buffer) to refresh
        self._addresses: dict[int, int] = {}  # static input index -> data_ptr at capture
        self._static_outputs: Any = None
        self._lock = threading.Lock()

    @property
    def code(self) -> str:
        """The generated code the graph was captured from."""
        return str(self.inner.code)

    def _capture(self, args: Sequence[Any]) -> None:
        inputs = [
            a.clone() if isinstance(a, torch.Tensor) and i not in self.static else a
            for i, a in enumerate(args)
        ]
        with self.api.warmup_stream(self.inner.device):
            for _ in range(self.warmup):
                self.inner.run(list(inputs))
        graph = self.api.graph()
        with self.api.capture(graph):
            outputs = self.inner.run(list(inputs), tracking=False)
        self._graph, self._inputs, self._static_outputs = graph, inputs, outputs
        self._copies = [
            (i, buffer)
            for i, buffer in enumerate(inputs)
            if i not in self.static and isinstance(buffer, torch.Tensor)
        ]
        self._addresses = {
            i: a.data_ptr()
            for i, a in enumerate(args)
            if i in self.static and isinstance(a, torch.Tensor)
        }
        self.captures += 1

    def _moved(self, args: Sequence[Any]) -> bool:
        """A static input is not the tensor the graph captured."""
        return any(args[i].data_ptr() != address for i, address in self._addresses.items())

    def __call__(self, args: list[Any]) -> Any:
        if self.blockers:
            return self.inner(args)
        with self._lock:  # one set of buffers: calls replay one at a time
            if self._graph is None or self._moved(args):
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
            for i, buffer in self._copies:  # the inputs that change; weights are read in place
                buffer.copy_(args[i])
            args.clear()
            self._graph.replay()
            return tuple(
                o.clone() if isinstance(o, torch.Tensor) else o for o in self._static_outputs
            )
