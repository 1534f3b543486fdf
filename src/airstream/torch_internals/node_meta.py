"""Private torch APIs of the node metadata torch's tracers write and read: module stacks, stack
traces and annotations (Dynamo, AOTAutograd, ``torch.fx.traceback.annotate``), FX's map from a
generated line to its node, and an ``nn.Module``'s own state."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.torch_internals.registry import (
    _attr,
    _bind,
    _feature,
    _get,
    _module_reads,
    _optional,
    _takes,
)

# --- node metadata torch's tracers write ------------------------------------------------------


@_feature(
    "trace_meta",
    "node.meta keys 'nn_module_stack' (Dynamo), 'fwd_nn_module_stack' (AOTAutograd, backward "
    "nodes) and 'stack_trace'",
    "core",
    "module-path selection in passes (backward graphs included) and source lines in errors",
)
def _probe_trace_meta() -> None:
    _module_reads("torch._functorch._aot_autograd.utils", "fwd_nn_module_stack", "nn_module_stack")
    _module_reads("torch.fx.proxy", "nn_module_stack", "stack_trace")


@_feature(
    "annotate",
    "torch.fx.traceback.annotate and the node.meta['custom'] key it writes",
    "import",
    "airstream.stream's annotation, which carries a stream into backward graphs",
)
def _probe_annotate() -> Callable[..., Any]:
    annotate = _attr("torch.fx.traceback:annotate")
    _takes(annotate, "annotation_dict")
    _module_reads("torch.fx.traceback", "custom")
    _module_reads("torch.fx.proxy", "custom")
    return annotate


annotate: Callable[..., Any] = _bind("annotate")  # airstream.stream is traced by Dynamo: bound now


def module_stack(node: torch.fx.Node) -> Mapping[str, Any]:
    """The node's ``nn_module_stack`` (forward and inference graphs) or, in a backward graph, the
    stack of the forward node it came from (``fwd_nn_module_stack``); ``{}`` when unknown."""
    return node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}


def stack_trace(node: torch.fx.Node) -> str | None:
    """The Python stack the node was traced from, if recorded."""
    return node.meta.get("stack_trace")


def drop_frames_under(gm: torch.fx.GraphModule, directory: str, keep: str | None = None) -> None:
    """Leave the frames of files under ``directory`` (except those under ``keep``) out of every
    node's recorded stack, so that the innermost frame left, which dumps, errors and explain name
    as the node's source line, is the user's (Dynamo traces through a library's
    TorchFunctionMode and context managers, whose frames would otherwise be innermost). A stack
    with nothing else left is kept."""
    prefix = os.path.join(directory, "")
    kept_prefix = os.path.join(keep, "") if keep is not None else None

    def library(frame: str) -> bool:
        if not frame.startswith(f'  File "{prefix}'):
            return False
        return kept_prefix is None or not frame.startswith(f'  File "{kept_prefix}')

    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if not trace or prefix not in trace:
            continue
        frames = [f for f in re.split(r'(?m)^(?=  File ")', trace) if f]
        kept = [f for f in frames if not library(f)]
        if kept and len(kept) < len(frames):
            node.meta["stack_trace"] = "".join(kept)


@_feature(
    "fx_line_map",
    "torch.fx.GraphModule._lineno_map and ._prologue_start (generated-code line -> node index)",
    "diagnostics",
    "naming the op and stream of an exception raised inside a compiled call",
)
def _probe_fx_line_map() -> bool:
    gm = torch.fx.symbolic_trace(lambda x: x.sin())
    lines, start = getattr(gm, "_lineno_map", None), getattr(gm, "_prologue_start", None)
    if not isinstance(lines, dict) or not lines or not isinstance(start, int):
        raise AttributeError("GraphModule has no _lineno_map dict and _prologue_start int")
    return True


def generated_node_index(module: torch.fx.GraphModule, lineno: int) -> int | None:
    """The index in ``module.graph.nodes`` of the node whose code is at line ``lineno`` of
    ``module``'s generated ``forward`` (FX's map from code lines to nodes); None when unknown."""
    if _optional("fx_line_map") is None:
        return None
    lines: dict[int, int | None] = module._lineno_map or {}
    return lines.get(lineno - module._prologue_start)


_MODULE_STATE = ("_parameters", "_buffers", "_modules")


@_feature(
    "module_state",
    "torch.nn.Module's own attributes _parameters, _buffers, _modules and its *_hooks dicts",
    "compile-cache",
    "keying a cache entry by a module's other attributes (what a trace may have read)",
)
def _probe_module_state() -> None:
    own = vars(torch.nn.Linear(1, 1))
    missing = [name for name in _MODULE_STATE if not isinstance(own.get(name), dict)]
    if missing or not any(k.startswith("_") and k.endswith("hooks") for k in own):
        raise AttributeError(f"nn.Module keeps no {missing or 'hooks'} attributes")


def module_attributes(module: torch.nn.Module) -> dict[str, Any]:
    """``module``'s own attributes (``vars``) without nn.Module's bookkeeping: its parameters,
    buffers, submodules and hook dicts."""
    _get("module_state")
    return {
        k: v
        for k, v in vars(module).items()
        if k not in _MODULE_STATE and not (k.startswith("_") and k.endswith("hooks"))
    }


def node_value(node: torch.fx.Node) -> Any:
    """The value a node stands for while compiling: ``meta["val"]`` in aten graphs, Dynamo's
    ``example_value`` in its own graph; None when neither is recorded."""
    value = node.meta.get("val")
    return value if value is not None else node.meta.get("example_value")


def copy_trace_meta(source: torch.fx.Node, dest: torch.fx.Node) -> None:
    """Give ``dest`` the source line and module path ``source`` was traced from (for a node a
    rewrite adds in its place)."""
    for key in ("stack_trace", "nn_module_stack", "fwd_nn_module_stack"):
        if key in source.meta:
            dest.meta[key] = source.meta[key]


def stream_annotations(node: torch.fx.Node) -> Mapping[str, Any]:
    """The node's ``torch.fx.traceback.annotate`` annotations (``{}`` when none)."""
    return node.meta.get("custom") or {}


def set_annotations(node: torch.fx.Node, annotations: Mapping[str, Any]) -> None:
    """Set the node's annotations, as ``torch.fx.traceback.annotate`` does while tracing."""
    node.meta["custom"] = dict(annotations)
