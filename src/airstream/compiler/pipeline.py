"""One graph's compile: passes -> the streams settled -> final built-ins -> (stream analysis,
plan, max-autotune's segments, executor: :func:`airstream.compiler.finish.finish_graph`), every step
announced to the observers.

This module runs the passes and, between the custom post pass(es) and the final built-ins,
settles the streams: the tagged events and PyTorch stream IR the passes left are lowered to
``record``/``wait``, and :func:`airstream.graph.streams.lower_streams` writes each node's stream
into one key, which every later stage reads. :func:`airstream.compiler.measuring.finish_placed` does
the rest (the candidates measured, where they are; :func:`airstream.compiler.finish.finish_graph`
for each), where the mode is resolved once per graph, by its device where the config leaves it at
``"default"`` (:func:`airstream.graph.mode.resolve_mode`). Where AOTAutograd saves the result (an
inference graph of torch.compile with airstream's backend, :mod:`airstream.compiler.graph_cache`, or
an ahead-of-time compile, :func:`airstream.cache_compile`), the graph as the passes left it is
saved with the executor (:mod:`airstream.compiler.cached_graph`), so a load starts at
``finish_placed``.

:class:`GraphCompiler` is the AOTAutograd graph compiler the backend hands AOTAutograd for the
inference, forward and backward graphs (and :func:`airstream.get_compiler` to those who call
AOTAutograd themselves).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.compiler.cached_graph import cached_graph
from airstream.compiler.measuring import finish_placed
from airstream.debug.dump import dump_observer
from airstream.debug.observers import CompileObserver
from airstream.graph.nodes import GRAPH_KIND_KEY, GRAPH_KINDS, graph_kind
from airstream.graph.streams import lower_streams
from airstream.ops.torch_streams import TorchStreams
from airstream.options.config import CompilerConfig
from airstream.passes.manager import PassManager
from airstream.passes.tagged_events import lower_tagged_events
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.schedule.torch_streams import lower_torch_streams, torch_streams_for

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

        results = tuple(PassManager(config, observer).run(gm, example_inputs, kind, settle))
        if not torch_internals.bundling_compile():
            return finish_placed(gm, config, kind, observer, results, self.capture_pool)
        # AOTAutograd keeps this graph in a cache entry (airstream.compiler.cached_graph): the graph
        # as the passes left it, which a load finishes as this process does now
        try:
            saved: bytes | str = torch_internals.dump_graph(gm)
        except Exception as exc:  # an object in the graph that cannot be pickled (a torch.Stream)
            saved = f"{type(exc).__name__}: {exc}"
        executor = finish_placed(gm, config, kind, observer, results, self.capture_pool)
        static = torch_internals.static_input_indices() if kind != "backward" else None
        return cached_graph(saved, config, kind, executor, static)
