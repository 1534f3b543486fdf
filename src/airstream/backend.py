"""The torch.compile entry: Dynamo graph -> AOTAutograd -> pass pipeline -> streams -> executor.

``get_backend(config)`` returns the backend for ``torch.compile(backend=...)``; the name
``"airstream"`` is registered through the ``torch_dynamo_backends`` entry point and takes
``options={"debug.run_eagerly": True, ...}``. AOTAutograd runs with
``keep_inference_input_mutations`` from the config, airstream's decomposition table, and a
partitioner that keeps every air op in the forward graph. Inference, training-forward and
training-backward graphs each go through the pipeline separately.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.fx

import airstream.ops.library  # noqa: F401  (registers the air ops)
from airstream import torch_internals
from airstream.config import CompilerConfig
from airstream.debug.dump import DumpObserver, GraphDumper, dumper_for
from airstream.decompositions import decomposition_table
from airstream.effects import effects
from airstream.nodes import GRAPH_KIND_KEY, GRAPH_KINDS, graph_kind
from airstream.errors import AirstreamError, ConfigError
from airstream.observers import CompileObserver, Observers
from airstream.openmp import openmp
from airstream.ops.native import NativeStreams, attach_native_streams, native_streams_of
from airstream.passes.manager import PassManager, PassResult, pass_name
from airstream.passes.tagged_events import lower_tagged_events
from airstream.runtime.codegen import Executor
from airstream.runtime.cpu import CpuExecutor
from airstream.runtime.cuda import CudaExecutor
from airstream.runtime.cuda_graphs import CudaGraphExecutor
from airstream.runtime.data_dump import DataDumpExecutor
from airstream.runtime.native import NativeObjects
from airstream.runtime.serial import SerialExecutor
from airstream.schedule.fuse import CompiledSegment, fuse_streams
from airstream.schedule.native import has_native_streams, lower_native_streams
from airstream.schedule.plan import StreamPlan, build_plan
from airstream.streams import StreamAssignment, assign_streams

__all__ = [
    "AirstreamBackend",
    "CompiledGraph",
    "GraphCompiler",
    "get_backend",
    "get_compiler",
    "get_npu_backend",
    "registered_backend",
]


@dataclass(frozen=True)
class CompiledGraph:
    """One compiled graph: its kind, the optimized graph, its streams and plan, the passes run,
    the executor that runs it, and (max-autotune) what became of each segment."""

    kind: str
    graph_module: torch.fx.GraphModule
    streams: StreamAssignment
    plan: StreamPlan
    passes: tuple[PassResult, ...]
    executor: Executor
    segments: tuple[CompiledSegment, ...] = ()

    @property
    def fallbacks(self) -> int:
        """max-autotune segments Inductor could not compile (they run as aten code)."""
        return sum(1 for s in self.segments if s.node is None)


def _keep_air_ops_in_forward(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """Partition like Inductor, with every air op pinned to the forward graph.

    Air ops are side-effectful; untagged, the partitioner would copy them into the backward
    graph. Backward nodes get their streams from the ``air_stream`` annotation instead.
    """
    for node in joint.graph.nodes:
        if node.op == "call_function" and effects(node).air:  # air ops, prints, tagged events
            torch_internals.keep_in_forward(node)
    # The partitioner's own CSE (off here) would merge identical markers (two stream blocks with
    # the same label, two records) and so move nodes off their stream; airstream's region-aware
    # CSE runs on the forward and backward graphs afterwards instead.
    return torch_internals.min_cut_partition(joint, joint_inputs, **kwargs)


def _cuda_device(gm: torch.fx.GraphModule) -> torch.device | None:
    """The CUDA device the graph computes on, if any of its values live on one."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device
    return None


def _stream_labels(
    gm: torch.fx.GraphModule, *, single_stream: bool, graph_kind: str
) -> Mapping[str, str | None]:
    """Each node's stream as the graph stands, for the passes that consult it; its warnings
    (priority conflicts) are left to the stream analysis that plans the graph."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return assign_streams(gm, single_stream=single_stream, graph_kind=graph_kind).stream_of


class GraphCompiler:
    """An AOTAutograd graph compiler: ``(gm, example_inputs) -> boxed callable``.

    Passes -> stream analysis -> plan -> (max-autotune: fuse each stream's segments, then plan
    the fused graph) -> executor; every step announced to ``observer``.
    """

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
        lower_tagged_events(gm)
        if has_native_streams(gm):  # what passes wrote in PyTorch's stream IR
            native = native if native is not None else NativeStreams.from_registry()
            lower_native_streams(gm, native, graph_kind=kind)
        streams = assign_streams(gm, single_stream=single, graph_kind=kind)
        plan = build_plan(gm, streams)
        segments: tuple[CompiledSegment, ...] = ()
        dumping = config.debug.data_dump.type is not None  # runs node by node: nothing to fuse
        if config.mode == "max-autotune" and not dumping:
            segments = fuse_streams(
                gm,
                plan,
                graph_kind=kind,
                min_ops=config.experimental_config.min_segment_ops,
                threads_per_stream=config.stream_config.threads_per_stream,
                strict=config.debug.strict_max_autotune,
            )
            if any(s.node is not None for s in segments):  # plan the graph that will run
                streams = assign_streams(gm, single_stream=single, graph_kind=kind)
                plan = build_plan(gm, streams)
        executor = self._executor(gm, plan, kind)
        observer.plan_built(kind, gm, streams, plan, executor.code)
        observer.graph_compiled(
            CompiledGraph(kind, gm, streams, plan, tuple(results), executor, segments)
        )
        return executor

    def _executor(self, gm: torch.fx.GraphModule, plan: StreamPlan, kind: str) -> Executor:
        """Node by node for data_dump; serial for run_eagerly; CUDA streams (and graphs) on
        CUDA; threads on CPU.

        A CPU graph with nothing off the main stream runs serially: no thread to hand off to.
        """
        dump = self.config.debug.data_dump
        if dump.type is not None:
            return DataDumpExecutor(gm, dump.path, dump.filter)
        if self.config.debug.run_eagerly:
            return SerialExecutor(gm, plan)
        device = _cuda_device(gm)
        if device is not None:
            table = native_streams_of(gm)
            native = None if table is None else NativeObjects(table, at_run_time=kind != "backward")
            executor = CudaExecutor(gm, plan, device, native=native)
            if self.config.mode == "reduce-overhead":
                # Parameters and buffers are the same tensors every call: captured by address.
                torch_internals.require("cuda-graphs")
                static = torch_internals.static_input_indices() if kind != "backward" else None
                return CudaGraphExecutor(executor, gm, static or ())
            return executor
        if not any(s.runs for s in plan.side_streams):
            return SerialExecutor(gm, plan)
        streams = self.config.stream_config
        return CpuExecutor(
            gm,
            plan,
            streams.threads_per_stream,
            # released only where they spin long: after a short spin, the release costs more
            release_openmp_threads=streams.release_openmp_threads and openmp().spins_long,
            openmp_team=streams.openmp_team,
        )


class _Record(CompileObserver):
    """Appends every compiled graph to a backend's ``graphs``."""

    def __init__(self, graphs: list[CompiledGraph], lock: threading.Lock) -> None:
        self.graphs = graphs
        self.lock = lock

    def graph_compiled(self, compiled: CompiledGraph) -> None:
        with self.lock:
            self.graphs.append(compiled)


class AirstreamBackend:
    """The callable handed to ``torch.compile(backend=...)``.

    ``graphs`` lists every graph compiled through this backend (a CompiledGraph each), for
    inspection in tests, notebooks and tools; it is only written at compile time. ``observers``
    receive every compile event (:mod:`airstream.observers`); graph dumps subscribe when the
    config asks for them (``dumpers``: one per Dynamo graph).
    """

    def __init__(
        self,
        config: CompilerConfig,
        decompositions: Mapping[Any, Callable[..., Any]] | None = None,
        observers: Sequence[CompileObserver] = (),
    ) -> None:
        self.config = config
        self.decompositions = decomposition_table(decompositions)
        self.graphs: list[CompiledGraph] = []
        self.dumpers: list[GraphDumper] = []
        for i, observer in enumerate(observers):
            if not isinstance(observer, CompileObserver):
                raise TypeError(
                    f"observers[{i}] must be an airstream.observers.CompileObserver (subclass it "
                    f"and override the events you need), got {type(observer).__name__}"
                )
        self.observers = tuple(observers)
        self._lock = threading.Lock()

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        """Compile one Dynamo graph; airstream's errors come out with a readable traceback."""
        try:
            return self._compile(gm, example_inputs, kwargs)
        except AirstreamError as exc:
            raise _readable(exc) from exc.__cause__  # TORCHDYNAMO_VERBOSE=1 shows every frame

    def _compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Callable[..., Any]:
        torch_internals.require("core")
        config = self.config_for(kwargs)
        subscribers: list[CompileObserver] = [_Record(self.graphs, self._lock), *self.observers]
        dumper = dumper_for(config)
        if dumper is not None:
            with self._lock:
                self.dumpers.append(dumper)
            subscribers.append(DumpObserver(dumper))
        observer = Observers(subscribers)
        native = None
        if has_native_streams(gm):
            native = NativeStreams.from_registry()
            attach_native_streams(gm, native)
        observer.graph_traced(gm)
        if native is not None:  # before AOTAutograd, which would act on Dynamo's form
            lower_native_streams(gm, native, graph_kind="Dynamo")
        aot = torch_internals.aot_autograd(
            fw_compiler=GraphCompiler(config, "forward", observer, native),
            bw_compiler=GraphCompiler(config, "backward", observer, native),
            inference_compiler=GraphCompiler(config, "inference", observer, native),
            decompositions=self.decompositions,
            partition_fn=_keep_air_ops_in_forward,
            keep_inference_input_mutations=config.experimental_config.keep_inference_input_mutations,
        )
        return aot(gm, example_inputs)

    def config_for(self, compile_kwargs: Mapping[str, Any]) -> CompilerConfig:
        """The config a graph compiles with: this backend's, with ``torch.compile(...,
        options={dotted path: value})`` applied to a copy (``mode=`` too, when it is one of
        airstream's modes). Anything else torch.compile passes on is an error, not ignored."""
        options = compile_kwargs.get("options")
        mode = compile_kwargs.get("mode")
        unknown = sorted(set(compile_kwargs) - {"options", "mode"})
        if unknown:
            raise ConfigError(f"airstream's backend takes options= and mode=, not {unknown}")
        if not options and mode in (None, "default"):
            return self.config
        config = self.config.copy()
        try:
            for path, value in (options or {}).items():
                config.set_option(path, value)
            if mode not in (None, "default"):
                config.mode = mode
        except ConfigError as exc:
            raise ConfigError(f"torch.compile(..., options=/mode=): {exc}") from None
        return config

    def __repr__(self) -> str:
        """Short, as Dynamo prints it in every error: the options set to other than their
        defaults (``backend.config`` prints them all)."""
        defaults = CompilerConfig().as_dict()
        changed = [
            f"{path}={_short(value)}"
            for path, value in self.config.as_dict().items()
            if value != defaults.get(path)
        ]
        return f"{type(self).__name__}({', '.join(changed)})"


def _short(value: Any) -> str:
    """An option's value for the backend's repr: callables by name, lists of them too."""
    if isinstance(value, tuple):
        return f"[{', '.join(_short(v) for v in value)}]"
    return pass_name(value) if callable(value) else repr(value)


# Frames in these directories are left out of the traceback of airstream's compile errors.
_INTERNAL_DIRS = tuple(
    str(Path(module_file).parent) + os.sep for module_file in (torch.__file__, __file__)
)


def _full_traceback() -> bool:
    """``TORCHDYNAMO_VERBOSE=1``, the flag that also keeps Dynamo's own frames, keeps them all."""
    return os.environ.get("TORCHDYNAMO_VERBOSE", "0") == "1"


def _raised_through(exc: BaseException) -> list[TracebackType]:
    """The traceback entries of ``exc`` and its ``__cause__`` chain as one stack, outermost
    first: each cause continues below the frame that raised its consequence."""
    entries: list[TracebackType] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        own: list[TracebackType] = []
        tb = current.__traceback__
        while tb is not None:
            own.append(tb)
            tb = tb.tb_next
        if entries and own and entries[-1].tb_frame is own[0].tb_frame:
            entries.pop()  # the frame that caught the cause: its call line, not its raise line
        entries += own
        current = current.__cause__
    return entries


def _readable(exc: AirstreamError) -> AirstreamError:
    """``exc`` with a traceback a user reads: the frames of their code (the pass that raised,
    the line that raised in it), none of torch's or airstream's; with ``TORCHDYNAMO_VERBOSE=1``
    every frame, the causes' included (Dynamo prints the error without its causes)."""
    entries = _raised_through(exc)
    if not _full_traceback():
        entries = [
            e for e in entries if not e.tb_frame.f_code.co_filename.startswith(_INTERNAL_DIRS)
        ]
    tb: TracebackType | None = None
    for entry in reversed(entries):
        tb = TracebackType(tb, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return exc.with_traceback(tb)


def _check_config(config: Any) -> CompilerConfig:
    if config is None:
        return CompilerConfig()
    if not isinstance(config, CompilerConfig):
        raise TypeError(
            f"compiler_config must be an airstream.CompilerConfig, got {type(config).__name__}"
        )
    return config


def get_backend(
    compiler_config: CompilerConfig | None = None,
    *,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    observers: Sequence[CompileObserver] = (),
) -> AirstreamBackend:
    """The backend for ``torch.compile(model, backend=get_backend(config))``.

    The config object is read at compile time (each graph), and is the object passes receive.
    ``decompositions`` adds entries to airstream's (empty by default) decomposition table;
    ``observers`` receive its compile events (:class:`airstream.observers.CompileObserver`).
    """
    return AirstreamBackend(_check_config(compiler_config), decompositions, observers)


get_npu_backend = get_backend


def get_compiler(compiler_config: CompilerConfig | None = None) -> GraphCompiler:
    """An AOTAutograd ``fw_compiler`` (also usable as ``bw_compiler``) running airstream's pipeline.

    For users who call ``aot_module_simplified`` themselves. The graph kind is inferred: a graph
    with ``tangents`` inputs is a backward graph, anything else a forward graph.
    """
    return GraphCompiler(_check_config(compiler_config), None)


def registered_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """``torch.compile(m, backend="airstream", options={"debug.run_eagerly": True, ...})``."""
    try:
        config = CompilerConfig.from_options(options)
    except ConfigError as exc:
        raise ConfigError(f"torch.compile(backend='airstream', options=...): {exc}") from None
    return AirstreamBackend(config)(gm, example_inputs)
