"""The rest of a graph's compile once its passes have run: the stream analysis of the settled
graph, the plan, max-autotune's segments (and the plan again), the executor; every step
announced to the observers. :class:`airstream.compiler.pipeline.GraphCompiler` runs the passes and
then this, through :func:`airstream.compiler.measuring.finish_placed` (once per candidate where the
placement is measured), for a compiled graph and one loaded from a compile cache alike.
"""

from __future__ import annotations

import warnings

import torch.fx

from airstream.debug.observers import CompiledGraph, CompileObserver
from airstream.graph.devices import graph_device
from airstream.graph.fused import CompiledSegment
from airstream.graph.mode import resolve_mode
from airstream.graph.streams import assign_streams, lower_streams
from airstream.options.config import CompilerConfig
from airstream.passes.manager import PassResult
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.runtime.select import choose_executor
from airstream.schedule.fuse import fuse_streams
from airstream.schedule.plan import build_plan

__all__ = ["finish_graph"]


def finish_graph(
    gm: torch.fx.GraphModule,
    config: CompilerConfig,
    kind: str,
    observer: CompileObserver,
    results: tuple[PassResult, ...] = (),
    static_inputs: tuple[int, ...] | None = None,
    capture_pool: CapturePool | None = None,
    loaded: bool = False,
) -> Executor:
    """The rest of a graph's compile once its passes have run: its streams, the plan,
    max-autotune's segments, the executor. ``capture_pool``: shared by the graphs of one
    compiled function (CUDA graphs' memory); ``loaded``: the graph came from a compile cache."""
    # settled by the pipeline; a graph given here directly is settled as it stands
    streams = lower_streams(gm, single_stream=config.ge_config.enable_single_stream)
    for note in streams.notes:
        warnings.warn(note, stacklevel=2)
    plan = build_plan(gm, streams)
    segments: tuple[CompiledSegment, ...] = ()
    device = graph_device(gm)
    mode = resolve_mode(config, device.type)
    dumping = config.debug.data_dump.type is not None  # runs node by node: nothing to fuse
    if mode == "max-autotune" and not dumping:
        segments = fuse_streams(
            gm,
            plan,
            graph_kind=kind,
            min_ops=config.experimental_config.min_segment_ops,
            threads_per_stream=config.stream_config.threads_per_stream,
            strict=config.debug.strict_max_autotune,
        )
        if segments:  # plan the graph that will run (views_after edits it even if none fused)
            streams = assign_streams(gm)
            plan = build_plan(gm, streams)
    gm.recompile()  # once: gm.code shows the graph that runs (the executor has its own)
    executor = choose_executor(
        gm, plan, kind, config, mode, device, static_inputs, capture_pool=capture_pool
    )
    observer.graph_compiled(
        CompiledGraph(kind, gm, streams, plan, results, executor, segments, mode, loaded)
    )
    return executor
