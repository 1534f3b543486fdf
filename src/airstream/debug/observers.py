"""Compile events the backend publishes, for whoever subscribes (dumps, ``explain``, tools).

Data flows one way: the backend compiles and announces what it did; observers look and never
steer (:class:`ReadOnly` holds the observers a user gives the backend to that).
``CompileObserver`` extends the pass pipeline's :class:`PassObserver` (the graph as the pipeline
receives it, before each pass, after each stage, a failure) with the events around it::

    graph_traced     the Dynamo graph, before AOTAutograd (once per Dynamo graph)
    started ... stage_done ... failed      the pass pipeline (per inference/forward/backward graph)
    graph_compiled   the CompiledGraph handed to AOTAutograd: the final graph, its streams,
                     its plan, its passes' results and the executor (its code)

:class:`Observers` (several as one) and :class:`ReadOnly` (one held to looking) forward every
event through one method each.

Runtime events (a call's per-stream timeline) go through ``runtime/trace.py``'s listeners.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from airstream.errors import AirstreamError
from airstream.graph.fused import CompiledSegment
from airstream.graph.nodes import MEASUREMENT_KEY
from airstream.graph.streams import StreamAssignment
from airstream.passes.manager import PassObserver, PassResult, PassSpec
from airstream.runtime.codegen import Executor
from airstream.runtime.measured import Measurement, Measurements
from airstream.schedule.plan import StreamPlan
from airstream.torch_internals import stream_annotations

__all__ = ["CompileObserver", "CompiledGraph", "Observers", "ReadOnly"]


@dataclass(frozen=True)
class CompiledGraph:
    """One compiled graph: its kind, the optimized graph, its streams and plan, the passes run,
    the executor that runs it, (max-autotune) what became of each segment, the mode it
    compiled in (``"default"`` resolved by its device), and whether it was loaded from a
    compile cache (``loaded``: its passes ran in the process that saved it, so ``passes`` is
    empty)."""

    kind: str
    graph_module: torch.fx.GraphModule
    streams: StreamAssignment
    plan: StreamPlan
    passes: tuple[PassResult, ...]
    executor: Executor
    segments: tuple[CompiledSegment, ...] = ()
    mode: str = "reduce-overhead"
    loaded: bool = False

    @property
    def measurements(self) -> Measurements | None:
        """With ``stream_config.measure_placement``: what the graph's first calls measured, one
        stream against the placement, per size range, and what each range kept (None: not
        measured)."""
        found = self.graph_module.meta.get(MEASUREMENT_KEY)
        return found if isinstance(found, Measurements) else None

    @property
    def measurement(self) -> Measurement | None:
        """The measurement of the size range called last (a static graph's only one); None
        before the first call or where not measured."""
        measurements = self.measurements
        return None if measurements is None else measurements.current

    @property
    def fallbacks(self) -> int:
        """max-autotune segments Inductor could not compile (they run as aten code)."""
        return sum(1 for s in self.segments if s.node is None)


class CompileObserver(PassObserver):
    """Hooks around one compile; every method is a no-op by default."""

    def graph_traced(self, gm: torch.fx.GraphModule) -> None:
        """The graph Dynamo captured, before AOTAutograd."""

    def graph_compiled(self, compiled: CompiledGraph) -> None:
        """The compiled graph, as ``backend.graphs`` lists it."""


class _Forwarding(CompileObserver):
    """Every event handed on through :meth:`_forward`, the one place a subclass says how."""

    def _forward(self, event: str, gm: torch.fx.GraphModule, *args: Any) -> list[Any]:
        """Hand ``event(*args)`` on (``gm``: the graph it shows); return what each answered."""
        raise NotImplementedError

    def graph_traced(self, gm: torch.fx.GraphModule) -> None:
        self._forward("graph_traced", gm, gm)

    def started(self, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self._forward("started", gm, gm, graph_kind)

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self._forward("before_pass", gm, spec, gm, graph_kind)

    def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self._forward("stage_done", gm, stage, gm, graph_kind)

    def failed(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> str | None:
        paths = [p for p in self._forward("failed", gm, spec, gm, graph_kind) if p]
        return paths[0] if paths else None

    def graph_compiled(self, compiled: CompiledGraph) -> None:
        self._forward("graph_compiled", compiled.graph_module, compiled)


class Observers(_Forwarding):
    """Several observers as one, called in order."""

    def __init__(self, observers: Sequence[CompileObserver]) -> None:
        self.observers = tuple(observers)

    def _forward(self, event: str, gm: torch.fx.GraphModule, *args: Any) -> list[Any]:
        return [getattr(o, event)(*args) for o in self.observers]


def _fingerprint(gm: torch.fx.GraphModule) -> list[tuple[object, ...]]:
    """What a compile reads from a graph: each node, its call and arguments, its meta keys and
    its annotations (streams are read from them)."""
    return [
        (n, n.op, n.target, n.args, n.kwargs, tuple(n.meta), dict(stream_annotations(n)))
        for n in gm.graph.nodes
    ]


class ReadOnly(_Forwarding):
    """An observer held to looking: after each event that hands it a graph, the graph must be as
    it was (nodes, arguments, meta keys, annotations), else the compile stops with an error
    naming the observer and the event. The backend wraps the observers a user gives it."""

    def __init__(self, observer: CompileObserver) -> None:
        self.observer = observer
        # airstream 0.x's plan_built(graph_kind, gm, streams, plan, code), folded into
        # graph_compiled: still called, with a warning, for an observer that defines it
        self._plan_built = getattr(observer, "plan_built", None)
        if self._plan_built is not None:
            warnings.warn(
                f"airstream: observer {type(observer).__qualname__} defines plan_built, which "
                "is now part of graph_compiled(compiled): read compiled.graph_module, "
                "compiled.streams, compiled.plan and compiled.executor.code there. plan_built "
                "is still called for now",
                FutureWarning,
                stacklevel=5,  # get_backend's caller
            )

    def _forward(self, event: str, gm: torch.fx.GraphModule, *args: Any) -> list[Any]:
        if event == "failed":  # the graph is the failing pass's: nothing to guard
            return [self.observer.failed(*args)]
        before = _fingerprint(gm)
        answer = getattr(self.observer, event)(*args)
        if event == "graph_compiled" and self._plan_built is not None:
            (c,) = args
            self._plan_built(c.kind, c.graph_module, c.streams, c.plan, c.executor.code)
        if _fingerprint(gm) != before:
            raise AirstreamError(
                f"observer {type(self.observer).__qualname__} changed the graph in {event}: "
                "observers look and never steer. Copy what you need (gm.graph, node.meta) "
                "instead of editing it; to change the graph, write a pass "
                "(config.post_grad_custom_pre_pass / post_grad_custom_post_pass)."
            )
        return [answer]
