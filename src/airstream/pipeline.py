"""One graph's compile: passes -> stream analysis -> plan -> (max-autotune: fuse, plan again)
-> executor, every step announced to the observers. The mode is resolved once per graph, by its
device where the config leaves it at ``"default"`` (:func:`airstream.mode.resolve_mode`).

:class:`GraphCompiler` is the AOTAutograd graph compiler the backend hands AOTAutograd for the
inference, forward and backward graphs (and :func:`airstream.get_compiler` to those who call
AOTAutograd themselves). The stream analysis of each settled version of the graph is computed
once (:func:`airstream.streams.stream_analysis`) and shared by the final passes, the planner and
the dumps; its notes (a stream given two priorities) are emitted once, here.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.config import CompilerConfig
from airstream.debug.dump import DumpObserver, dumper_for
from airstream.fused import CompiledSegment
from airstream.mode import resolve_mode
from airstream.nodes import GRAPH_KIND_KEY, GRAPH_KINDS, graph_kind
from airstream.observers import CompiledGraph, CompileObserver
from airstream.ops.native import NativeStreams, attach_native_streams
from airstream.passes.manager import PassManager
from airstream.passes.tagged_events import lower_tagged_events
from airstream.runtime.codegen import Executor
from airstream.runtime.select import choose_executor, cuda_device
from airstream.schedule.fuse import fuse_streams
from airstream.schedule.native import has_native_streams, lower_native_streams
from airstream.schedule.plan import build_plan
from airstream.streams import StreamAssignment, mark_version, stream_analysis, unmark_version

__all__ = ["GraphCompiler"]

SCOPE_KEY = "air_scope"  # node.meta: the non-stream scope keys in force (TorchAir's scopes)


def _stream_labels(
    gm: torch.fx.GraphModule, *, single_stream: bool, graph_kind: str
) -> Mapping[str, str | None]:
    """Each node's stream as the graph stands, for the final passes that consult it."""
    return stream_analysis(gm, single_stream=single_stream, graph_kind=graph_kind).stream_of


def _settled(
    gm: torch.fx.GraphModule, single: bool, kind: str, changed: bool = True
) -> StreamAssignment:
    """The stream analysis of the graph as the pipeline leaves it: a new version if a stage
    ``changed`` it, else the version the last pass left (its analysis kept if made)."""
    if changed:
        unmark_version(gm)
        mark_version(gm)
    return stream_analysis(gm, single_stream=single, graph_kind=kind)


class GraphCompiler:
    """An AOTAutograd graph compiler: ``(gm, example_inputs) -> boxed callable``."""

    def __init__(
        self,
        config: CompilerConfig,
        kind: str | None,
        observer: CompileObserver | None = None,
        native: NativeStreams | None = None,
    ) -> None:
        if kind is not None and kind not in GRAPH_KINDS:
            raise ValueError(f"graph kind must be one of {GRAPH_KINDS}, got {kind!r}")
        self.config = config
        self.kind = kind
        self.observer = observer
        self.native = native  # the Dynamo graph's streams and events, shared by its graphs

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
        streams = _settled(gm, single, kind, changed)
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
            if any(s.node is not None for s in segments):  # plan the graph that will run
                streams = _settled(gm, single, kind)
                plan = build_plan(gm, streams)
        _record_scopes(gm, streams)
        gm.recompile()  # once: gm.code shows the graph that runs (the executor has its own)
        executor = choose_executor(gm, plan, kind, config, mode, device)
        observer.plan_built(kind, gm, streams, plan, executor.code)
        observer.graph_compiled(
            CompiledGraph(kind, gm, streams, plan, tuple(results), executor, segments, mode)
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
