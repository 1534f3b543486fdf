"""Compile events the backend publishes, for whoever subscribes (dumps, ``explain``, tools).

Data flows one way: the backend compiles and announces what it did; observers look and never
steer. ``CompileObserver`` extends the pass pipeline's :class:`PassObserver` (the graph as the
pipeline receives it, before each pass, after each stage, a failure) with the events around it::

    graph_traced     the Dynamo graph, before AOTAutograd (once per Dynamo graph)
    started ... stage_done ... failed      the pass pipeline (per inference/forward/backward graph)
    plan_built       the final graph, its streams, its plan and the code that will run
    graph_compiled   the CompiledGraph handed to AOTAutograd

Runtime events (a call's per-stream timeline) go through ``runtime/trace.py``'s listeners.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch.fx

from airstream.passes.manager import PassObserver, PassSpec
from airstream.schedule.plan import StreamPlan
from airstream.streams import StreamAssignment

if TYPE_CHECKING:  # the backend (above this module) defines CompiledGraph
    from airstream.backend import CompiledGraph

__all__ = ["CompileObserver", "Observers"]


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
