"""Private torch APIs of AOTAutograd and its partitioner: tracing Dynamo's graph into forward,
backward and inference aten graphs, keeping a node in the forward, the min-cut partition, and the
inputs AOTAutograd treats as static or saves for the backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.torch_internals.registry import (
    _attr,
    _feature,
    _get,
    _module_reads,
    _takes,
)

# --- core: AOTAutograd and the partitioner ----------------------------------------------------


@_feature(
    "aot_autograd",
    "torch._dynamo.backends.common.aot_autograd and torch._functorch.aot_autograd."
    "aot_module_simplified(fw_compiler, bw_compiler, inference_compiler, decompositions, "
    "partition_fn, keep_inference_input_mutations)",
    "core",
    "tracing Dynamo's graph into forward, backward and inference aten graphs",
)
def _probe_aot_autograd() -> tuple[Callable[..., Any], Callable[..., Any]]:
    aot = _attr("torch._dynamo.backends.common:aot_autograd")
    simplified = _attr("torch._functorch.aot_autograd:aot_module_simplified")
    _takes(
        simplified,
        "fw_compiler",
        "bw_compiler",
        "inference_compiler",
        "decompositions",
        "partition_fn",
        "keep_inference_input_mutations",
    )
    return aot, simplified


@_feature(
    "partitioner",
    "functorch.compile.min_cut_rematerialization_partition, torch._functorch.config.cse and "
    "node.meta['partitioner_tag'] = 'must_be_in_forward'",
    "core",
    "splitting training graphs with every air op kept in the forward graph",
)
def _probe_partitioner() -> tuple[Callable[..., Any], Any]:
    partition = _attr("functorch.compile:min_cut_rematerialization_partition")
    _takes(partition, "joint_module", "num_fwd_outputs")
    config = _attr("torch._functorch:config")
    if not isinstance(config.cse, bool):
        raise AttributeError("torch._functorch.config.cse is not a bool option")
    _module_reads("torch._functorch.partitioners", "partitioner_tag", "must_be_in_forward")
    return partition, config


def aot_autograd(**kwargs: Any) -> Any:
    """torch's ``aot_autograd`` backend factory (Dynamo graph -> AOTAutograd -> compilers)."""
    return _get("aot_autograd")[0](**kwargs)


def aot_module_simplified(*args: Any, **kwargs: Any) -> Any:
    """AOTAutograd on a Dynamo graph, for code that wires the compilers itself."""
    return _get("aot_autograd")[1](*args, **kwargs)


def keep_in_forward(node: torch.fx.Node) -> None:
    """Tell the partitioner that ``node`` must stay in the forward graph."""
    node.meta["partitioner_tag"] = "must_be_in_forward"


def min_cut_partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """Inductor's min-cut partitioner with its own CSE off (it would merge identical air ops,
    e.g. two scopes with the same label, and so move nodes off their stream)."""
    partition, config = _get("partitioner")
    with config.patch(cse=False):
        return partition(joint, joint_inputs, **kwargs)


@_feature(
    "static_inputs",
    "torch._guards.TracingContext.try_get() and its fw_metadata.static_input_indices "
    "(AOTAutograd's ViewAndMutationMeta)",
    "cuda-graphs",
    "capturing parameters and buffers by address in CUDA graphs instead of copying them per replay",
)
def _probe_static_inputs() -> Callable[[], Any]:
    context = _attr("torch._guards:TracingContext")
    meta = _attr("torch._functorch._aot_autograd.schemas:ViewAndMutationMeta")
    fields = getattr(meta, "__dataclass_fields__", {})
    if "static_input_indices" not in fields:
        raise AttributeError("ViewAndMutationMeta has no static_input_indices field")
    if not callable(getattr(context, "try_get", None)):
        raise AttributeError("TracingContext.try_get is missing")
    return context.try_get


def static_input_indices() -> tuple[int, ...] | None:
    """Inside an AOTAutograd compiler call: the indices of the graph inputs that are parameters
    or buffers (the same tensor every call); None when torch does not say."""
    context = _get("static_inputs")()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    indices = getattr(metadata, "static_input_indices", None)
    return tuple(indices) if indices is not None else None


def saved_for_backward_start() -> int | None:
    """Inside AOTAutograd's forward compiler call: the index of the forward graph's first output
    that is saved for the backward (those before it are the user's outputs and mutated inputs,
    ``ViewAndMutationMeta.num_forward``); None when torch does not say."""
    context = _get("static_inputs")()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    start = getattr(metadata, "num_forward", None)
    return int(start) if isinstance(start, int) else None
