"""The rest of a graph's compile once its passes have run: the stream analysis of the settled
graph, the plan, max-autotune's segments (and the plan again), the executor; every step
announced to the observers. :class:`airstream.pipeline.GraphCompiler` runs the passes and then
this; a graph loaded from the compile cache (:mod:`airstream.cached_graph`) starts here.
"""

from __future__ import annotations

import warnings

import torch
import torch.fx

from airstream.config import CompilerConfig
from airstream.fused import CompiledSegment
from airstream.mode import resolve_mode
from airstream.observers import CompiledGraph, CompileObserver
from airstream.passes.manager import PassResult
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.runtime.select import choose_executor, cuda_device
from airstream.schedule.fuse import fuse_streams
from airstream.schedule.plan import build_plan
from airstream.streams import StreamAssignment, mark_version, stream_analysis, unmark_version

__all__ = ["SCOPE_KEY", "finish_graph"]

SCOPE_KEY = "air_scope"  # node.meta: the non-stream scope keys in force (TorchAir's scopes)


def settled(
    gm: torch.fx.GraphModule, single: bool, kind: str, changed: bool = True
) -> StreamAssignment:
    """The stream analysis of the graph as the pipeline leaves it: a new version if a stage
    ``changed`` it, else the version the last pass left (its analysis kept if made)."""
    if changed:
        unmark_version(gm)
        mark_version(gm)
    return stream_analysis(gm, single_stream=single, graph_kind=kind)


def finish_graph(
    gm: torch.fx.GraphModule,
    config: CompilerConfig,
    kind: str,
    observer: CompileObserver,
    results: tuple[PassResult, ...] = (),
    changed: bool = True,
    static_inputs: tuple[int, ...] | None = None,
    capture_pool: CapturePool | None = None,
) -> Executor:
    """The rest of a graph's compile once its passes have run: its streams, the plan,
    max-autotune's segments, the executor. A graph loaded from the compile cache starts here.
    ``capture_pool``: shared by the graphs of one compiled function (CUDA graphs' memory)."""
    single = config.ge_config.enable_single_stream
    streams = settled(gm, single, kind, changed)
    for note in streams.notes:
        warnings.warn(note, stacklevel=2)
    plan = build_plan(gm, streams)
    segments: tuple[CompiledSegment, ...] = ()
    device = cuda_device(gm)
    mode = resolve_mode(config, device.type if device is not None else _device_type(gm))
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
            streams = settled(gm, single, kind)
            plan = build_plan(gm, streams)
    _record_scopes(gm, streams)
    gm.recompile()  # once: gm.code shows the graph that runs (the executor has its own)
    executor = choose_executor(
        gm, plan, kind, config, mode, device, static_inputs, capture_pool=capture_pool
    )
    observer.plan_built(kind, gm, streams, plan, executor.code)
    observer.graph_compiled(
        CompiledGraph(kind, gm, streams, plan, results, executor, segments, mode)
    )
    return executor


def _device_type(gm: torch.fx.GraphModule) -> str:
    """``"cpu"``, or the type of the first other device a value of the graph lives on (MPS,
    XPU, ...: the CPU's default mode is not theirs)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type not in ("cpu", "meta"):
            return str(val.device.type)
    return "cpu"


def _record_scopes(gm: torch.fx.GraphModule, streams: StreamAssignment) -> None:
    """Each node's non-stream scope keys (TorchAir's super-kernel and timeout scopes) in
    ``node.meta["air_scope"]`` of the compiled graph."""
    if not streams.scope_attrs:
        return
    for node in gm.graph.nodes:
        attrs = streams.scope_attrs.get(node.name)
        if attrs is not None:
            node.meta[SCOPE_KEY] = dict(attrs)
