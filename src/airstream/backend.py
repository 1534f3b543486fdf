"""The torch.compile entry: Dynamo graph -> AOTAutograd -> each graph's pipeline
(:mod:`airstream.compiler.pipeline`).

``get_backend(config)`` returns the backend for ``torch.compile(backend=...)``; the name
``"airstream"`` is registered through the ``torch_dynamo_backends`` entry point and takes
``options={"debug.run_eagerly": True, ...}``. AOTAutograd runs with
``keep_inference_input_mutations`` from the config, airstream's decomposition table, and a
partitioner that keeps every air op in the forward graph. Inference, training-forward and
training-backward graphs each go through the pipeline separately. An inference graph is kept in
AOTAutograd's cache for the next process (:mod:`airstream.compiler.graph_cache`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

import airstream.ops.library  # noqa: F401  (registers the air ops)
from airstream import torch_internals
from airstream.compiler.cached_graph import cached_graph_class, loading_for
from airstream.compiler.decompositions import decomposition_table
from airstream.compiler.graph_cache import graph_cache_key
from airstream.compiler.pipeline import GraphCompiler
from airstream.compiler.tracebacks import readable
from airstream.debug.dump import GraphDumper, dump_observer
from airstream.debug.observers import CompiledGraph, CompileObserver, Observers, ReadOnly
from airstream.errors import AirstreamError, ConfigError
from airstream.graph.effects import effects
from airstream.graph.nodes import GRAPH_KIND_KEY, GRAPH_KINDS
from airstream.options.config import CompilerConfig
from airstream.passes.manager import pass_name
from airstream.runtime.capture_pool import CapturePool
from airstream.schedule.torch_streams import lower_torch_streams, torch_streams_for

__all__ = [
    "AirstreamBackend",
    "CompiledGraph",
    "GraphCompiler",
    "get_backend",
    "get_compiler",
    "get_npu_backend",
    "registered_backend",
    "GRAPH_KINDS",
]


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


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


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
    receive every compile event (:mod:`airstream.debug.observers`); graph dumps subscribe when the
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
                    f"observers[{i}] must be an airstream.debug.observers.CompileObserver "
                    "(subclass it and override the events you need), got "
                    f"{type(observer).__name__}"
                )
        self.observers = tuple(observers)
        self._read_only = tuple(ReadOnly(o) for o in observers)
        self._lock = threading.Lock()

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        """Compile one Dynamo graph; airstream's errors come out with a readable traceback."""
        try:
            return self._compile(gm, example_inputs, kwargs)
        except AirstreamError as exc:
            raise readable(exc) from exc.__cause__  # TORCHDYNAMO_VERBOSE=1 shows every frame

    def _compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Callable[..., Any]:
        torch_internals.require("core")
        # airstream's own frames (the TorchAir layer's device mode, airstream.stream) are not
        # the user's source line; its examples are user code
        torch_internals.drop_frames_under(
            gm, _PACKAGE_DIR, keep=os.path.join(_PACKAGE_DIR, "examples")
        )
        config = self.config_for(kwargs)
        subscribers: list[CompileObserver] = [_Record(self.graphs, self._lock), *self._read_only]
        dumps = dump_observer(config)
        if dumps is not None:
            with self._lock:
                self.dumpers.append(dumps.dumper)
            subscribers.append(dumps)
        observer = Observers(subscribers)
        gm.meta[GRAPH_KIND_KEY] = "Dynamo"  # for messages (graph_kind(gm) does not take it)
        torch_streams = torch_streams_for(gm)
        observer.graph_traced(gm)
        if torch_streams is not None:  # before AOTAutograd, which would act on Dynamo's form
            lower_torch_streams(gm, torch_streams)
            gm.recompile()  # AOTAutograd runs the module
        pool = CapturePool()  # its graphs' CUDA graphs share memory, as cudagraph trees'
        key = graph_cache_key(config, self.decompositions, example_inputs, bool(self.observers))
        forward: Any = GraphCompiler(config, "forward", observer, torch_streams, pool)
        if key is not None:  # AOTAutograd looks the graph up in its cache first (graph_cache.py)
            forward = torch_internals.serializable_compiler(forward, cached_graph_class())
        aot = torch_internals.aot_autograd(
            fw_compiler=forward,
            bw_compiler=GraphCompiler(config, "backward", observer, torch_streams, pool),
            inference_compiler=GraphCompiler(config, "inference", observer, torch_streams, pool),
            decompositions=self.decompositions,
            partition_fn=_keep_air_ops_in_forward,
            keep_inference_input_mutations=config.experimental_config.keep_inference_input_mutations,
        )
        if key is None:
            return aot(gm, example_inputs)
        with torch_internals.saving_graphs(key), loading_for(observer, pool):
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
    ``observers`` receive its compile events (:class:`airstream.debug.observers.CompileObserver`).
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
