"""One graph's compile: passes -> the streams settled -> final built-ins -> (stream analysis,
plan, max-autotune's segments, executor: :func:`airstream.finish.finish_graph`), every step
announced to the observers.

This module runs the passes and, between the custom post pass(es) and the final built-ins,
settles the streams: the tagged events and PyTorch stream IR the passes left are lowered to
``record``/``wait``, and :func:`airstream.streams.lower_streams` writes each node's stream into
one key, which every later stage reads. :func:`airstream.finish.finish_graph` does the rest,
where the mode is resolved once per graph, by its device where the config leaves it at
``"default"`` (:func:`airstream.mode.resolve_mode`). In an ahead-of-time compile
(:func:`airstream.cache_compile`) the graph as the passes left it is saved with the executor
(:mod:`airstream.cached_graph`), so a load starts at ``finish_graph``.

:class:`GraphCompiler` is the AOTAutograd graph compiler the backend hands AOTAutograd for the
inference, forward and backward graphs (and :func:`airstream.get_compiler` to those who call
AOTAutograd themselves).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.cached_graph import cached_graph
from airstream.config import CompilerConfig
from airstream.debug.dump import dump_observer
from airstream.decisions import DecisionStore, decision_store
from airstream.devices import graph_device
from airstream.finish import finish_graph
from airstream.mode import resolve_mode
from airstream.nodes import (
    AUTO_STREAMS_KEY,
    CANDIDATES_KEY,
    GRAPH_KIND_KEY,
    GRAPH_KINDS,
    MEASUREMENT_KEY,
    NAMES_KEY,
    graph_kind,
)
from airstream.observers import CompileObserver
from airstream.ops.torch_streams import TorchStreams
from airstream.passes.auto.candidates import LIST_SCHEDULE, in_original_order, measured_here
from airstream.passes.manager import PassManager
from airstream.passes.tagged_events import lower_tagged_events
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.runtime.measured import (
    ALL_SIZES,
    ONE_STREAM,
    PLACED,
    MeasuredExecutor,
    Measurement,
    Measurements,
)
from airstream.runtime.size_ranges import SizeRanges, size_ranges
from airstream.schedule.torch_streams import lower_torch_streams, torch_streams_for
from airstream.streams import (
    STREAM_KEY,
    lower_streams,
    on_one_stream,
    on_streams,
    uses_streams,
)

__all__ = ["GraphCompiler", "settle_streams"]


def settle_streams(
    gm: torch.fx.GraphModule, config: CompilerConfig, torch_streams: TorchStreams | None = None
) -> None:
    """The end of the passes: what they wrote as TorchAir tagged events or in PyTorch's stream
    IR lowered to ``record``/``wait``, then each node's stream written into its key
    (``ge_config.enable_single_stream``: main for every node)."""
    lower_tagged_events(gm)
    table = torch_streams_for(gm, torch_streams)
    if table is not None:
        lower_torch_streams(gm, table)
    lower_streams(gm, single_stream=config.ge_config.enable_single_stream)


class GraphCompiler:
    """An AOTAutograd graph compiler: ``(gm, example_inputs) -> boxed callable``."""

    def __init__(
        self,
        config: CompilerConfig,
        kind: str | None,
        observer: CompileObserver | None = None,
        torch_streams: TorchStreams | None = None,
        capture_pool: CapturePool | None = None,
    ) -> None:
        if kind is not None and kind not in GRAPH_KINDS:
            raise ValueError(f"graph kind must be one of {GRAPH_KINDS}, got {kind!r}")
        self.config = config
        self.kind = kind
        self.observer = observer
        # the Dynamo graph's streams and events, shared by its graphs
        self.torch_streams = torch_streams
        # the Dynamo graph's CUDA graph memory, shared by its graphs (forward and backward)
        self.capture_pool = capture_pool

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Executor:
        torch_internals.require("core")
        config = self.config
        kind = self.kind or graph_kind(gm)
        gm.meta[GRAPH_KIND_KEY] = kind  # passes ask airstream.passes.graph_kind(gm)
        observer = self.observer
        if observer is None:  # called directly (get_compiler): dumps as the config asks
            observer = dump_observer(config) or CompileObserver()
        torch_streams = self.torch_streams
        if torch_streams is not None:
            torch_streams_for(gm, torch_streams)

        def settle(graph: torch.fx.GraphModule) -> None:
            settle_streams(graph, config, torch_streams)

        results = PassManager(config, observer).run(gm, example_inputs, kind, settle)
        saved = torch_internals.dump_graph(gm) if torch_internals.bundling_compile() else None
        measuring = _measuring(gm, config, kind) if _measures(gm, config, kind, saved) else None
        if measuring is not None and measuring.settled is not None:
            # a static graph an earlier process decided: only the candidate it kept compiles
            settled = measuring.settled
            graph = {ONE_STREAM: measuring.one_stream, **measuring.alternatives}.get(
                str(settled.chosen), gm
            )
            graph.meta[MEASUREMENT_KEY] = Measurements("", {ALL_SIZES: settled}, ALL_SIZES)
            return finish_graph(
                graph, config, kind, observer, tuple(results), capture_pool=self.capture_pool
            )
        executor = finish_graph(
            gm, config, kind, observer, tuple(results), capture_pool=self.capture_pool
        )
        if saved is not None:  # an ahead-of-time compile (airstream.cache_compile) saves it
            static = torch_internals.static_input_indices() if kind != "backward" else None
            return cached_graph(saved, config, kind, executor, static)
        if measuring is not None:  # measured against one stream over the first calls
            candidates = {PLACED: executor}
            for name, graph in measuring.alternatives.items():  # auto_streams' other placements
                candidates[name] = finish_graph(
                    graph, config, kind, CompileObserver(), tuple(results)
                )
            # simplest first: a placement must beat a simpler one (measured.decide)
            candidates = dict(sorted(candidates.items(), key=lambda c: measuring.crossings[c[0]]))
            candidates[ONE_STREAM] = finish_graph(
                measuring.one_stream, config, kind, CompileObserver(), tuple(results)
            )
            options = config.stream_config
            sizes, store = measuring.sizes, measuring.store
            measured = MeasuredExecutor(
                candidates,
                options.measure_calls,
                options.measure_min_gain,
                sizes=sizes,
                described_sizes="" if sizes is None else sizes.describe(),
                known=measuring.known,
                on_decided=store.save if store is not None else None,
            )
            gm.meta[MEASUREMENT_KEY] = measured.measurements
            return measured
        return executor


@dataclass(frozen=True)
class _Measuring:
    """What measuring a placed graph needs, taken before it is fused: the graph on one stream,
    auto_streams' alternatives (by candidate name), its size ranges (None: static), where its
    decisions are kept (None: nowhere), those kept before (by range), and a static graph's
    decision kept before (``settled``: then only the candidate it kept is built)."""

    one_stream: torch.fx.GraphModule
    alternatives: dict[str, torch.fx.GraphModule]
    sizes: SizeRanges | None
    store: DecisionStore | None
    known: dict[str, Measurement]
    settled: Measurement | None
    crossings: dict[str, int]  # each placement's values handed between streams


def _crossings(gm: torch.fx.GraphModule) -> int:
    """How many (value, reader) pairs of a placement are on different streams: the syncs it
    asks for, before the planner drops those earlier waits imply."""
    return sum(
        1
        for node in gm.graph.nodes
        for user in node.users
        if STREAM_KEY in node.meta
        and STREAM_KEY in user.meta
        and node.meta[STREAM_KEY] != user.meta[STREAM_KEY]
    )


def _measuring(gm: torch.fx.GraphModule, config: CompilerConfig, kind: str) -> _Measuring:
    bounds = config.stream_config.measure_ranges
    sizes = size_ranges(gm, None if bounds == "pow2" else bounds)
    mode = resolve_mode(config, graph_device(gm).type)
    store = decision_store(gm, config, kind, mode, STREAM_KEY)
    known = store.load() if store is not None else {}
    names = {f"auto_streams {name}": name for name in gm.meta.get(NAMES_KEY, ())}
    settled = known.get(ALL_SIZES) if sizes is None else None
    if settled is not None and settled.chosen not in (PLACED, ONE_STREAM, *names):
        settled = None  # kept for candidates this compile does not have: measured again
    alternatives = {}
    for candidate, name in names.items():
        if settled is not None and settled.chosen != candidate:
            continue  # decided before: only what was kept is built
        graph = on_streams(gm, functools.partial(_label_in, name))
        if name != LIST_SCHEDULE:
            in_original_order(graph)
        alternatives[candidate] = graph
    crossings = {PLACED: _crossings(gm), **{k: _crossings(g) for k, g in alternatives.items()}}
    return _Measuring(on_one_stream(gm), alternatives, sizes, store, known, settled, crossings)


def _label_in(candidate: str, node: torch.fx.Node) -> str | None:
    """A node's stream in an alternative placement (auto_streams' candidates.py)."""
    labels = node.meta.get(CANDIDATES_KEY)
    return labels.get(candidate) if isinstance(labels, dict) else None


def _measures(
    gm: torch.fx.GraphModule, config: CompilerConfig, kind: str, saved: bytes | None
) -> bool:
    """Whether ``stream_config.measure_placement`` measures this graph: a CPU inference graph
    the passes (with ``"auto"``: auto_streams) put on several streams, run by streams (no debug
    executor, not saved ahead of time: an entry on disk holds one executor)."""
    setting = config.stream_config.measure_placement
    decision = gm.meta.get(AUTO_STREAMS_KEY)
    auto_placed = decision is not None and bool(getattr(decision, "applied", False))
    return (
        (setting is True or (setting == "auto" and auto_placed))
        and kind == "inference"
        and saved is None
        and measured_here(gm, config)
        and uses_streams(gm)
    )
