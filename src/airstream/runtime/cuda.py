"""CUDA runtime: one CUDA stream per label, events for the plan's syncs, issued from one thread.

The plan's steps are issued from the calling thread in ``plan.sequence`` order (each stream's order,
every record before its waits) as one FX-generated function. Side streams are forked from the
caller's current stream (they wait on an event recorded there first) and joined back (the plan's
join: the caller's stream waits for each side stream's last step). A tensor used on a stream other
than the one that made it (graph inputs and outputs included) gets ``record_stream`` for the
consumer, so the caching allocator never hands its memory out while that stream may still read it;
inside a CUDA graph capture too, where the allocator would otherwise give a freed block straight to
the next allocation on the producer's stream, with nothing in the graph ordering that write after
the other stream's read.

Every call runs under a device guard (the caller's current device is left as it was, and a model
on ``cuda:1`` issues on ``cuda:1`` whatever the caller's device) and restores the caller's current
stream. If an op raises, the caller's stream still waits for every side stream before the error
reaches the caller: what was issued may still read the caller's tensors. A call whose caller's
stream is capturing uses fresh events and this thread's private side streams (dedicated streams,
so no stream another thread uses joins the capture). In airstream's own capture the user's
streams and events are left alone (the replay stands for the call:
:class:`~airstream.runtime.torch_streams.TorchStreamsAround`); in the user's own
``torch.cuda.graph`` the call does what eager code does there: a side stream standing for one of
the model's streams runs on that stream, and the user's events are recorded and waited for, so
the user's code after the call, inside the same capture, can wait for them. Events are reused
across calls (one set per concurrent call): once issued, a wait no longer depends on the event's
later records.

All CUDA calls go through a :class:`~airstream.runtime.cuda_api.CudaApi`.
"""

from __future__ import annotations

import contextlib
import operator
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from airstream.ops.torch_streams import NATIVE_OPS
from airstream.runtime.codegen import (
    Builder,
    GeneratedCode,
    Hooks,
    Label,
    LazyTraced,
    generate,
    inputs_read,
)
from airstream.runtime.cuda_api import CUDA, CudaApi
from airstream.runtime.torch_streams import TorchStreamObjects, torch_stream_step
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.schedule.plan import StreamPlan

__all__ = ["CudaExecutor"]


def _use(api: CudaApi, streams: Sequence[Any], index: int) -> None:
    api.set_stream(streams[index])


def _fork(streams: Sequence[Any], events: Sequence[Any], index: int) -> None:
    """Every side stream starts after the work already queued on the caller's stream."""
    events[index].record(streams[0])
    for stream in streams[1:]:
        stream.wait_event(events[index])


def _record(streams: Sequence[Any], index: int, events: Sequence[Any], event: int) -> None:
    events[event].record(streams[index])


def _wait(streams: Sequence[Any], index: int, events: Sequence[Any], event: int) -> None:
    streams[index].wait_event(events[event])


def _keep(value: Any, api: CudaApi, streams: Sequence[Any], index: int) -> None:
    """``value`` is about to be used on ``streams[index]``: keep its memory until that stream's
    use has run."""
    api.keep(value, streams[index])


class _IssueHooks(Hooks):
    """One function issues every stream's steps: stream switches, events, record_stream, and
    the steps on the user's own streams and events (``natives``: the call's objects by registry
    index, None while capturing)."""

    params = ("streams", "events", "api", "natives")

    def __init__(self, labels: Sequence[Label], plan: StreamPlan, fork_event: int) -> None:
        self.index_of = {label: i for i, label in enumerate(labels)}  # main (None) first
        self.producer = plan.stream_of()
        self.fork_event = fork_event
        self.current: Label = None

    def begin(self, b: Builder) -> None:
        if len(self.index_of) > 1:
            b.call(_fork, b.params["streams"], b.params["events"], self.fork_event)

    def switch(self, b: Builder, label: Label) -> None:
        b.call(_use, b.params["api"], b.params["streams"], self.index_of[label])
        self.current = label

    def end(self, b: Builder) -> None:
        if self.current is not None:
            b.call(_use, b.params["api"], b.params["streams"], 0)

    def record(self, b: Builder, label: Label, event: int) -> None:
        b.call(_record, b.params["streams"], self.index_of[label], b.params["events"], event)

    def wait(self, b: Builder, label: Label, event: int) -> None:
        b.call(_wait, b.params["streams"], self.index_of[label], b.params["events"], event)

    def native(
        self,
        b: Builder,
        label: Label,
        node: torch.fx.Node,
        read: Callable[[torch.fx.Node], torch.fx.Node],
    ) -> torch.fx.Node | None:
        found = torch_stream_step(node)
        if found is None:
            return None
        fn, takes_api = found
        p = b.params
        stream = b.call(operator.getitem, p["streams"], self.index_of[label])
        args = [read(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
        if takes_api:
            return b.call(fn, p["natives"], stream, p["api"], *args)
        return b.call(fn, p["natives"], stream, *args)

    def first_use(
        self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node
    ) -> None:
        source = None if node.op == "placeholder" else self.producer.get(node)
        if source != label:  # made on another stream (inputs: on the caller's)
            p = b.params
            b.call(_keep, value, p["api"], p["streams"], self.index_of[label])


class CudaExecutor:
    """Boxed callable issuing a StreamPlan on CUDA streams from the calling thread.

    ``native``: the user's own streams and events of a graph with PyTorch's stream IR; a side
    stream standing for one of the model's ``torch.Stream`` objects runs on that object."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        plan: StreamPlan,
        device: torch.device,
        api: CudaApi | None = None,
        native: TorchStreamObjects | None = None,
    ) -> None:
        self._boxed_call = True
        self.plan = plan
        self.device = device
        self.api = api if api is not None else CUDA
        self.native = native
        self._fork_event = max((s.event for s in plan.syncs), default=-1) + 1
        self._num_events = self._fork_event + 1
        # Streams that run nothing are left out: forked but never joined, they would make a
        # CUDA graph capture fail, and a wait on them orders nothing.
        self._sides_used = [s.label for s in plan.side_streams if s.runs]
        self._priorities = [plan.priorities.get(str(label), 0) for label in self._sides_used]
        self._native_sides = native.side_labels(self._sides_used) if native is not None else {}
        # every registry index a call reads: its native side streams, its native steps' objects
        steps_read = [
            arg
            for n in gm.graph.nodes
            if n.op == "call_function" and n.target in NATIVE_OPS
            for arg in n.args
            if isinstance(arg, int) and not isinstance(arg, bool)
        ]
        self._native_indices = sorted({*self._native_sides.values(), *steps_read})
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
        self.generated = generated
        self.module = generated.module
        self._fn = generated.fn
        self._traced = LazyTraced(lambda: build(traced=True).fn)
        self._stream_of = plan.stream_of()
        self._sides: list[Any] | None = None
        self._free_events: deque[list[Any]] = deque()  # event sets no call is issuing with

    @property
    def code(self) -> str:
        """The generated code that issues every stream's work."""
        return self.module.code

    def side_streams(
        self, capturing: bool, objects: dict[int, Any] | None = None, own: bool = True
    ) -> list[Any]:
        """The side streams of a call: the labels' own, the model's stream objects for those
        that stand for one (``objects``: the call's, by registry index), or (while the caller's
        stream captures) this thread's private ones; inside the user's own capture (``own``
        False) a side standing for a model's stream still runs on it, as in eager code."""
        api = self.api
        native = self._native_sides if self.native is not None else {}
        found: dict[int, Any] = {}
        if native and not (capturing and own):
            found = objects if objects is not None else self.native_objects()
        if capturing:
            return [
                api.adopt_stream(found[native[str(label)]])
                if str(label) in native and found
                else api.private_stream(self.device, f"capture side {i + 1}", priority)
                for i, (label, priority) in enumerate(
                    zip(self._sides_used, self._priorities, strict=True)
                )
            ]
        if native:  # the caller's objects, per call
            return [
                api.adopt_stream(found[native[str(label)]])
                if str(label) in native
                else api.label_stream(self.device, str(label), priority)
                for label, priority in zip(self._sides_used, self._priorities, strict=True)
            ]
        if self._sides is None:
            self._sides = [
                api.label_stream(self.device, str(label), priority)
                for label, priority in zip(self._sides_used, self._priorities, strict=True)
            ]
        return self._sides

    def native_objects(self) -> dict[int, Any]:
        """The user's streams and events this graph uses, for the call in progress."""
        assert self.native is not None
        return self.native.for_call(self._native_indices)

    @property
    def native_side_indices(self) -> list[int]:
        """The registry indices of the model's streams that side work of this graph runs on."""
        return sorted(set(self._native_sides.values()))

    def _take_events(self, capturing: bool) -> list[Any]:
        if not capturing:
            with contextlib.suppress(IndexError):
                return self._free_events.pop()
        return [self.api.new_event() for _ in range(self._num_events)]

    def __call__(self, args: list[Any]) -> Any:
        """Issue one call (emptying ``args``, the boxed convention)."""
        api = self.api
        with api.device(self.device):
            caller = api.current_stream(self.device)
            capturing = api.capturing()
            own = capturing and api.capturing_own()  # airstream's capture, not the user's
            traced: Any = self._traced.get() if not capturing and tracing_wanted() else None
            objects = None if own or self.native is None else self.native_objects()
            streams = [caller, *self.side_streams(capturing, objects, own)]
            events = self._take_events(capturing)
            natives = None if objects is None else objects.__getitem__
            trace = None if traced is None else CallTrace()  # its clock starts once code exists
            try:
                if trace is None:
                    return self._fn(args, streams, events, api, natives)
                traces = {s.label: trace.stream(s.label) for s in self.plan.streams}
                return traced(args, streams, events, api, natives, traces)
            except BaseException as error:
                _join_after_error(streams)
                where = self.generated.locate(error, self._stream_of)
                error.add_note(f"airstream: raised by {where}")
                raise
            finally:
                api.set_stream(caller)
                if not capturing:
                    self._free_events.append(events)
                if trace is not None:
                    trace.finish()


def _join_after_error(streams: Sequence[Any]) -> None:
    """The caller's stream waits for whatever the side streams were given before the error."""
    for stream in streams[1:]:
        with contextlib.suppress(Exception):  # a broken context: the original error says why
            streams[0].wait_stream(stream)
