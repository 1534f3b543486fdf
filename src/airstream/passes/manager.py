"""The pass pipeline: custom pre pass(es) -> built-in passes -> custom post pass(es) -> (the
pipeline settles the streams: each node's stream written into its key) -> the final built-ins
(in-place rewriting, on the graph with its final streams).

Every pass is called as ``fn(gm, example_inputs, config)`` and edits ``gm.graph`` in place; a
custom pass written for Inductor (``fn(graph)``, torch's ``CustomGraphPass``, a pattern matcher's
pass) gets ``gm.graph`` as Inductor gives it, a ``CustomGraphModulePass`` gets ``gm``. The return
value is ignored (a custom pass returning anything but None gets a warning at its source
line). Around each pass the manager (not the pass) does the bookkeeping: it
times it, tags the nodes it added (``meta["air_inserted_by"]``), refills ``meta["val"]`` for them
and lints, and with ``debug.verify_passes`` also re-checks every node's metadata. It does not
recompile the module after each pass: the executor generates the code of the final graph, and the
dumps print the graph itself; a pass that calls ``gm(...)`` recompiles first (``gm.recompile()``).
Built-ins are also checked never to remove, merge or move an air op. Any failure becomes a
:class:`~airstream.errors.PassError` naming the pass, its stage and the graph kind.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from airstream.errors import PassError, StreamError
from airstream.graph.effects import effects
from airstream.graph.nodes import INSERTED_BY_KEY, describe
from airstream.ops.library import adopt_air_aliases, record, wait, wait_tensor
from airstream.options.checks import callable_source, pass_style
from airstream.options.config import CompilerConfig
from airstream.passes.builtin import BUILTIN_PASSES, FINAL_PASSES
from airstream.passes.meta import check_meta, fill_meta, node_inputs
from airstream.passes.regions import air_layout
from airstream.torch_internals import is_graph_module_pass

__all__ = [
    "PassManager",
    "PassObserver",
    "PassResult",
    "PassSpec",
    "STAGES",
    "as_graph_pass",
    "pass_name",
]

log = logging.getLogger("airstream.passes")

PRE, BUILTIN, POST = "post_grad_custom_pre_pass", "builtin", "post_grad_custom_post_pass"
FINAL = "builtin_final"
STAGES = (PRE, BUILTIN, POST, FINAL)

GraphPass = Callable[[torch.fx.GraphModule, Sequence[Any], CompilerConfig], Any]


def pass_name(fn: Callable[..., Any]) -> str:
    """A readable, qualified name for a pass callable."""
    qualname = getattr(fn, "__qualname__", None)
    if qualname is None:
        return type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    name = f"{module}.{qualname}" if module else qualname
    code = getattr(fn, "__code__", None)
    if "<lambda>" in qualname and code is not None:
        name += f" ({code.co_filename}:{code.co_firstlineno})"
    return name


@dataclass(frozen=True)
class PassSpec:
    """One pass in the pipeline: ``fn`` as the user gave it (its name and source line in every
    message), ``call`` how the manager calls it (``fn`` itself, or an Inductor-style pass
    adapted: :func:`as_graph_pass`)."""

    name: str
    stage: str
    fn: Any
    call: GraphPass | None = None

    def run(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> Any:
        return (self.call or self.fn)(gm, example_inputs, config)


def as_graph_pass(fn: Any) -> GraphPass:
    """``fn`` callable as ``(gm, example_inputs, config)``: itself, or an Inductor custom pass
    (``fn(graph)``; a ``CustomGraphModulePass``: ``fn(gm)``) wrapped to be."""
    if pass_style(fn) != "graph":
        return fn
    if is_graph_module_pass(fn):
        return lambda gm, example_inputs, config: fn(gm)
    return lambda gm, example_inputs, config: fn(gm.graph)


@dataclass(frozen=True)
class PassResult:
    """What one pass did to one graph: timing and node counts."""

    name: str
    stage: str
    graph_kind: str
    seconds: float
    nodes_before: int
    nodes_after: int


class PassObserver:
    """Instrument hooks around the pipeline (graph dumps use them); all no-ops by default."""

    def started(self, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        """The graph as the pipeline receives it."""

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        """About to run ``spec``."""

    def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        """Every pass of ``stage`` has run."""

    def failed(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> str | None:
        """``spec`` failed; return where the graph from before it was written, if anywhere."""
        return None


def _slot(value: Any) -> tuple[GraphPass, ...]:
    if value is None:
        return ()
    if callable(value):
        return (value,)
    return tuple(value)


class PassManager:
    """Runs the configured passes over a graph, with the instruments around each one."""

    def __init__(self, config: CompilerConfig, observer: PassObserver | None = None) -> None:
        self.config = config
        self.observer = observer or PassObserver()
        specs = [
            PassSpec(pass_name(fn), PRE, fn, as_graph_pass(fn))
            for fn in _slot(config.post_grad_custom_pre_pass)
        ]
        for option, fn in BUILTIN_PASSES:
            if config.get_option(option):
                specs.append(PassSpec(fn.__name__, BUILTIN, fn))
        specs += [
            PassSpec(pass_name(fn), POST, fn, as_graph_pass(fn))
            for fn in _slot(config.post_grad_custom_post_pass)
        ]
        for option, fn in FINAL_PASSES:
            if config.get_option(option):
                specs.append(PassSpec(fn.__name__, FINAL, fn))
        self.passes: tuple[PassSpec, ...] = tuple(specs)

    def run(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        graph_kind: str,
        settle: Callable[[torch.fx.GraphModule], object] | None = None,
        stages: Sequence[str] | None = None,
    ) -> list[PassResult]:
        """Run every pass on ``gm`` in order (only those of ``stages`` where given: a graph a
        pass set aside finishes the stages after it); return a result per pass. ``settle(gm)``
        runs once between the custom post pass(es) and the final built-ins, which read the
        streams it settles (:func:`airstream.graph.streams.lower_streams`)."""
        results = []
        self.observer.started(gm, graph_kind)
        specs = self.passes if stages is None else [s for s in self.passes if s.stage in stages]
        for i, spec in enumerate(specs):
            if settle is not None and spec.stage == FINAL:
                settle(gm)
                settle = None
            self.observer.before_pass(spec, gm, graph_kind)
            results.append(self._run_one(spec, gm, example_inputs, graph_kind))
            last_of_stage = i + 1 == len(specs) or specs[i + 1].stage != spec.stage
            if last_of_stage:
                self.observer.stage_done(spec.stage, gm, graph_kind)
        if settle is not None:
            settle(gm)
        return results

    def _error(self, spec: PassSpec, kind: str, message: str, gm: Any = None) -> PassError:
        where = self.observer.failed(spec, gm, kind) if gm is not None else None
        if where:
            message += f"\nThe graph from before this pass is in {where}"
        return PassError(
            f"pass {spec.name!r} (stage {spec.stage}) on the {kind} graph: {message}",
            pass_name=spec.name,
            stage=spec.stage,
            graph_kind=kind,
        )

    def _run_one(
        self, spec: PassSpec, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str
    ) -> PassResult:
        before_nodes = node_inputs(gm)  # the nodes, each with its target and arguments
        layout = air_layout(gm.graph) if spec.stage in (BUILTIN, FINAL) else None
        collectives = _collective_order(gm.graph)
        start = time.perf_counter()
        try:
            returned = spec.run(gm, example_inputs, self.config)
        except Exception as exc:
            message = f"raised {type(exc).__name__}: {exc}"
            if spec.call is not None and spec.call is not spec.fn:  # adapted: fn(graph)
                message += (
                    ". It takes one argument, so airstream called it as Inductor calls its "
                    "custom passes: with gm.graph, a torch.fx.Graph (a CustomGraphModulePass "
                    "gets gm). A pass that needs the GraphModule, example_inputs or config "
                    "takes (gm, example_inputs, config)."
                )
            raise self._error(spec, kind, message, gm) from exc
        seconds = time.perf_counter() - start
        adapted = spec.call is not None and spec.call is not spec.fn
        if returned is not None and spec.stage in (PRE, POST) and not adapted:
            _warn_returned(spec, gm, returned)  # Inductor ignores its passes' results too
        if spec.stage in (PRE, POST):
            adopt_air_aliases(gm.graph)  # TorchAir's npugraph_ex.* names for the air ops
        for node in gm.graph.nodes:
            if node not in before_nodes:
                node.meta.setdefault(INSERTED_BY_KEY, spec.name)
        early = _wait_before_record(gm.graph)
        if early is not None:
            raise self._error(spec, kind, early, gm)
        try:
            gm.graph.lint()  # O(nodes); blames a malformed graph on the pass that made it
            fill_meta(gm, example_inputs, before_nodes)
        except Exception as exc:
            raise self._error(
                spec,
                kind,
                f"left a graph that cannot be compiled: {type(exc).__name__}: {exc}",
                gm,
            ) from exc
        if collectives:
            _check_collective_order(spec, kind, collectives, _collective_order(gm.graph))
        if layout is not None:
            moved = air_layout(gm.graph).moved_since(layout)
            if moved:
                raise self._error(spec, kind, f"a built-in pass changed the air ops: {moved}", gm)
        if self.config.debug.verify_passes:
            try:
                check_meta(gm, example_inputs)
            except Exception as exc:
                raise self._error(
                    spec, kind, f"left the graph invalid: {type(exc).__name__}: {exc}", gm
                ) from exc
        result = PassResult(
            spec.name, spec.stage, kind, seconds, len(before_nodes), len(gm.graph.nodes)
        )
        log.debug("%s", result)
        return result


# warn_explicit's registry: each location warns once under the default filter
_warned: dict[Any, Any] = {}


def _warn_returned(spec: PassSpec, gm: torch.fx.GraphModule, returned: Any) -> None:
    """Warn that a custom pass's return value is ignored, at the pass's own source line."""
    if returned is gm:
        what = "gm itself (harmless, but airstream never reads it)"
    elif isinstance(returned, torch.fx.GraphModule):
        what = "a GraphModule other than gm: airstream keeps compiling gm, so what was changed "
        what += "only in the returned one is lost"
    else:
        what = f"a value of type {type(returned).__name__}"
    message = (
        f"pass {spec.name!r} (stage {spec.stage}) returned {what}. The return value of a pass "
        "is ignored: edit gm.graph in place (inserting_before/after, replace_all_uses_with, "
        "erase_node) and return None."
    )
    filename, lineno = callable_source(spec.fn) or ("<unknown pass>", 0)
    warnings.warn_explicit(message, UserWarning, filename, lineno, registry=_warned)


def _wait_before_record(graph: torch.fx.Graph) -> str | None:
    """What is wrong when a wait (``air.wait``, ``air.wait_tensor``) sits before a record or
    value it waits for; None when every wait comes after what it waits for. FX's lint would say
    only that a node is used before it is defined."""
    seen: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "call_function" and node.target in (wait, wait_tensor):
            for arg in node.all_input_nodes:
                if arg not in seen and arg.graph is graph:
                    what = "the record" if arg.target is record else "the value"
                    return (
                        f"{describe(node)} waits for {what} {describe(arg)}, which comes after "
                        "it in the graph: a wait must follow what it waits for. Insert the wait "
                        f"after it (with gm.graph.inserting_after({arg.name})), or move the "
                        "record earlier."
                    )
        seen.add(node)
    return None


def _collective_order(graph: torch.fx.Graph) -> list[str]:
    """The collectives of ``graph`` by name, in graph order (their issue order)."""
    return [node.name for node in graph.nodes if effects(node).collective]


def _check_collective_order(spec: PassSpec, kind: str, before: list[str], after: list[str]) -> None:
    """Collectives must keep Dynamo's order: it is the same on every rank, and the planner issues
    them in graph order whatever their streams. A pass that moves one across another could make
    ranks pair different collectives (a hang or a silently wrong sum)."""
    kept = set(before) & set(after)
    old = [name for name in before if name in kept]
    new = [name for name in after if name in kept]
    if old == new:
        return
    first = next(i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b)
    raise StreamError(
        f"pass {spec.name!r} (stage {spec.stage}) on the {kind} graph reordered collectives: "
        f"{new[first]!r} now comes before {old[first]!r}. Every rank must issue collectives in "
        "the same order, and airstream issues them in graph order whatever their streams; put "
        "collectives on streams (scope_enter/scope_exit, place_on_stream) without moving them."
    )
