"""Compile events the backend publishes, for whoever subscribes (dumps, ``explain``, tools).

Data flows one way: the backend compiles and announces what it did; observers look and never
steer (:class:`ReadOnly` holds the observers a user gives the backend to that).
``CompileObserver`` extends the pass pipeline's :class:`PassObserver` (the graph as the pipeline
receives it, before each pass, after each stage, a failure) with the events around it::

    graph_traced     the Dynamo graph, before AOTAutograd (once per Dynamo graph)
    started ... stage_done ... failed      the pass pipeline (per inference/forward/backward graph)
    plan_built       the final graph, its streams, its plan and the code that will run
    graph_compiled   the CompiledGraph handed to AOTAutograd

Runtime events (a call's per-stream timeline) go through ``runtime/trace.py``'s listeners.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.fx

from airstream.errors import AirstreamError
from airstream.fused import CompiledSegment
from airstream.passes.manager import PassObserver, PassResult, PassSpec
from airstream.runtime.codegen import Executor
from airstream.schedule.plan import StreamPlan
from airstream.streams import StreamAssignment
from airstream.torch_internals import stream_annotations

__all__ = ["CompileObserver", "CompiledGraph", "Observers", "ReadOnly"]


@dataclass(frozen=True)
class CompiledGraph:
    """One compiled graph: its kind, the optimized graph, its streams and plan, the passes run,
    the executor that runs it, (max-autotune) what became of each segment, and the mode it
    compiled in (``"default"`` resolved by its device)."""

    kind: str
    graph_module: torch.fx.GraphModule
    streams: StreamAssignment
    plan: StreamPlan
    passes: tuple[PassResult, ...]
    executor: Executor
    segments: tuple[CompiledSegment, ...] = ()
    mode: str = "reduce-overhead"

    @property
    def fallbacks(self) -> int:
        """max-autotune segments Inductor could not compile (they run as aten code)."""
        return sum(1 for s in self.segments if s.node is None)


class CompileObserver(PassObserver):
    """Hooks around one compile; every method is a no-op by default."""

    def graph_traced(self, gm: torch.fx.GraphModule) -> None:
        """The graph Dynamo captured, before AOTAutograd."""

    def plan_built(
        self,
        graph_kind: str,
        gm: torch.fx.GraphModule,
        streams: StreamAssignment,
        plan: StreamPlan,
        code: str,
    ) -> None:
        """The final graph (after max-autotune's fusion), its streams, plan and generated code."""

    def graph_compiled(self, compiled: CompiledGraph) -> None:
        """The compiled graph, as ``backend.graphs`` lists it."""


class Observers(CompileObserver):
    """Several observers as one, called in order."""

    def __init__(self, observers: Sequence[CompileObserver]) -> None:
        self.observers = tuple(observers)

    def graph_traced(self, gm: torch.fx.GraphModule) -> None:
        for o in self.observers:
            o.graph_traced(gm)

    def started(self, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        for o in self.observers:
            o.started(gm, graph_kind)

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        for o in self.observers:
            o.before_pass(spec, gm, graph_kind)

    def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        for o in self.observers:
            o.stage_done(stage, gm, graph_kind)

    def failed(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> str | None:
        paths = [p for o in self.observers if (p := o.failed(spec, gm, graph_kind))]
        return paths[0] if paths else None

    def plan_built(
        self,
        graph_kind: str,
        gm: torch.fx.GraphModule,
        streams: StreamAssignment,
        plan: StreamPlan,
        code: str,
    ) -> None:
        for o in self.observers:
            o.plan_built(graph_kind, gm, streams, plan, code)

    def graph_compiled(self, compiled: CompiledGraph) -> None:
        for o in self.observers:
            o.graph_compiled(compiled)


def _fingerprint(gm: torch.fx.GraphModule) -> list[tuple[object, ...]]:
    """What a compile reads from a graph: each node, its call and arguments, its meta keys and
    its annotations (streams are read from them)."""
    return [
        (n, n.op, n.target, n.args, n.kwargs, tuple(n.meta), dict(stream_annotations(n)))
        for n in gm.graph.nodes
    ]


class ReadOnly(CompileObserver):
    """An observer held to looking: after each event that hands it a graph, the graph must be as
    it was (nodes, arguments, meta keys, annotations), else the compile stops with an error
    naming the observer and the event. The backend wraps the observers a user gives it."""

    def __init__(self, observer: CompileObserver) -> None:
        self.observer = observer

    def _watch(self, event: str, gm: torch.fx.GraphModule, *args: object) -> None:
        """Hand the observer ``event`` and stop the compile if it changed the graph."""
        before = _fingerprint(gm)
        getattr(self.observer, event)(*args)
        if _fingerprint(gm) != before:
            raise AirstreamError(
                f"observer {type(self.observer).__qualname__} changed the graph in {event}: "
                "observers look and never steer. Copy what you need (gm.graph, node.meta) "
                "instead of editing it; to change the graph, write a pass "
                "(config.post_grad_custom_pre_pass / post_grad_custom_post_pass)."
            )

    def graph_traced(self, gm: torch.fx.GraphModule) -> None:
        self._watch("graph_traced", gm, gm)

    def started(self, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self._watch("started", gm, gm, graph_kind)

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self._watch("before_pass", gm, spec, gm, graph_kind)

    def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self._watch("stage_done", gm, stage, gm, graph_kind)

    def failed(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> str | None:
        return self.observer.failed(spec, gm, graph_kind)

    def plan_built(
        self,
        graph_kind: str,
        gm: torch.fx.GraphModule,
        streams: StreamAssignment,
        plan: StreamPlan,
        code: str,
    ) -> None:
        self._watch("plan_built", gm, graph_kind, gm, streams, plan, code)

    def graph_compiled(self, compiled: CompiledGraph) -> None:
        self._watch("graph_compiled", compiled.graph_module, compiled)
