"""One graph's compile: passes -> stream analysis -> plan -> (max-autotune: fuse, plan again)
-> executor, every step announced to the observers. This module runs the passes (and lowers the
tagged events and PyTorch stream IR they leave); :func:`airstream.finish.finish_graph` the rest,
where the mode is resolved once per graph, by its device where the config leaves it at
``"default"`` (:func:`airstream.mode.resolve_mode`). In an ahead-of-time compile
(:func:`airstream.cache_compile`) the graph as the passes left it is saved with the executor
(:mod:`airstream.cached_graph`), so a load starts at ``finish_graph``.

:class:`GraphCompiler` is the AOTAutograd graph compiler the backend hands AOTAutograd for the
inference, forward and backward graphs (and :func:`airstream.get_compiler` to those who call
AOTAutograd themselves). The stream analysis of each settled version of the graph is computed
once (:func:`airstream.streams.stream_analysis`) and shared by the final passes, the planner and
the dumps; its notes (a stream given two priorities) are emitted once, here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.cached_graph import cached_graph
from airstream.config import CompilerConfig
from airstream.debug.dump import DumpObserver, dumper_for
from airstream.finish import finish_graph
from airstream.nodes import GRAPH_KIND_KEY, GRAPH_KINDS, graph_kind
from airstream.observers import CompileObserver
from airstream.ops.native import NativeStreams, attach_native_streams
from airstream.passes.manager import PassManager
from airstream.passes.tagged_events import lower_tagged_events
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.schedule.native import has_native_streams, lower_native_streams
from airstream.streams import stream_analysis

__all__ = ["GraphCompiler"]


def _stream_labels(
    gm: torch.fx.GraphModule, *, single_stream: bool, graph_kind: str
) -> Mapping[str, str | None]:
    """Each node's stream as the graph stands, for the final passes that consult it."""
    return stream_analysis(gm, single_stream=single_stream, graph_kind=graph_kind).stream_of


class GraphCompiler:
    """An AOTAutograd graph compiler: ``(gm, example_inputs) -> boxed callable``."""

    def __init__(
        self,
        config: CompilerConfig,
        kind: str | None,
        observer: CompileObserver | None = None,
        native: NativeStreams | None = None,
        capture_pool: CapturePool | None = None,
    ) -> None:
        if kind is not None and kind not in GRAPH_KINDS:
            raise ValueError(f"graph kind must be one of {GRAPH_KINDS}, got {kind!r}")
        self.config = config
        self.kind = kind
        self.observer = observer
        self.native = native  # the Dynamo graph's streams and events, shared by its graphs
        # the Dynamo graph's CUDA graph memory, shared by its graphs (forward and backward)
        self.capture_pool = capture_pool

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Executor:
        torch_internals.require("core")
        config = self.config
        kind = self.kind or graph_kind(gm)
        gm.meta[GRAPH_KIND_KEY] = kind  # passes ask airstream.passes.graph_kind(gm)
        observer = self.observer
        if observer is None:  # called directly (get_compiler): dumps as the config asks
            dumper = dumper_for(config)
            observer = DumpObserver(dumper) if dumper is not None else CompileObserver()
        single = config.ge_config.enable_single_stream
        native = self.native
        if native is not None:
            attach_native_streams(gm, native)
        labels = functools.partial(_stream_labels, single_stream=single, graph_kind=kind)
        results = PassManager(config, observer, labels).run(gm, example_inputs, kind)
        nodes = len(gm.graph.nodes)
        changed = lower_tagged_events(gm) > 0 or len(gm.graph.nodes) != nodes
        if has_native_streams(gm):  # what passes wrote in PyTorch's stream IR
            native = native if native is not None else NativeStreams.from_registry()
            lower_native_streams(gm, native, graph_kind=kind)
            changed = True
        saved = torch_internals.dump_graph(gm) if torch_internals.bundling_compile() else None
        executor = finish_graph(
            gm, config, kind, observer, tuple(results), changed, capture_pool=self.capture_pool
        )
        if saved is not None:  # an ahead-of-time compile (airstream.cache_compile) saves it
            static = torch_internals.static_input_indices() if kind != "backward" else None
            return cached_graph(saved, config, kind, executor, static)
        return executor
