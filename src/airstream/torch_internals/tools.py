"""Private torch APIs of airstream's tools: the flop counter's formulas (auto_streams), profiler
ranges, the OpInfo sweep and the reference compilers the test suite needs (Dynamo's own entry
points are in ``dynamo``, the collectives' in ``collectives``)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.torch_internals.registry import (
    _attr,
    _feature,
    _get,
    _takes,
)

# --- auto_streams: the flop counter's formulas ----------------------------------------------


@_feature(
    "flop_formulas",
    "torch.utils.flop_counter.flop_registry (op packet -> formula(*args, out_val=...))",
    "auto-streams",
    "estimating each node's flops in auto_streams' flops cost model",
)
def _probe_flop_formulas() -> Mapping[Any, Callable[..., Any]]:
    registry = _attr("torch.utils.flop_counter:flop_registry")
    a, b = torch.empty(4, 8, device="meta"), torch.empty(8, 16, device="meta")
    flops = registry[torch.ops.aten.mm](a, b, out_val=torch.empty(4, 16, device="meta"))
    if flops != 2 * 4 * 8 * 16:
        raise ValueError(f"the mm formula counts {flops} flops for 4x8 @ 8x16, not 1024")
    return registry


def flop_formula(target: Any) -> Callable[..., Any] | None:
    """torch's flop formula for an op overload (called as ``formula(*args, out_val=out)`` on
    tensors or their metadata), or None for an op it has none for."""
    packet = getattr(target, "overloadpacket", None)
    return None if packet is None else _get("flop_formulas").get(packet)


@_feature(
    "size_hints",
    "torch.fx.experimental.symbolic_shapes.optimization_hint(symint, fallback=) (torch >= 2.13; "
    "size_hint on 2.11 and 2.12)",
    "auto-streams",
    "reading a symbolic size's example value in cost models without installing a guard (int() "
    "would pin the dimension, and every new size would recompile)",
)
def _probe_size_hints() -> Callable[..., int]:
    # torch 2.13 renamed size_hint (a hint that installs no guard) to optimization_hint
    names = ("optimization_hint", "size_hint")
    module = "torch.fx.experimental.symbolic_shapes"
    found = [_attr(f"{module}:{n}") for n in names if hasattr(importlib.import_module(module), n)]
    if not found:
        raise AttributeError(f"{module} has neither {' nor '.join(names)}")
    hint: Callable[..., int] = found[0]
    _takes(hint, "fallback")
    if hint(7, fallback=1) != 7:
        raise AttributeError(f"{hint.__name__}(7) is not 7")
    return hint


def size_hint(value: Any, fallback: int = 64) -> int:
    """The example value of a size (a SymInt's hint, without a guard; ``fallback`` for a size
    with none, such as a data-dependent one); ints come back as they are."""
    if isinstance(value, int):
        return value
    try:
        return int(_get("size_hints")(value, fallback=fallback))
    except Exception:  # an expression the shape environment cannot evaluate
        return fallback


# --- profiler ---------------------------------------------------------------------------------


@_feature(
    "record_function",
    "torch.ops.profiler._record_function_enter_new and "
    "torch.ops.profiler._record_function_exit._RecordFunction",
    "profiler",
    "naming each op `stream:node` in torch.profiler traces",
)
def _probe_record_function() -> tuple[Any, Any]:
    return (
        torch.ops.profiler._record_function_enter_new,
        torch.ops.profiler._record_function_exit._RecordFunction,
    )


def record_function_enter(name: str) -> Any:
    """Open a torch.profiler range on this thread; returns the handle to close it with."""
    return _get("record_function")[0](name, None)


def record_function_exit(handle: Any) -> None:
    """Close a range opened by :func:`record_function_enter`."""
    _get("record_function")[1](handle)


@_feature(
    "profiler_all_threads",
    "torch._C._profiler._ExperimentalConfig(profile_all_threads=True)",
    "testing",
    "tests that profile the stream worker threads with torch.profiler",
)
def _probe_profiler_all_threads() -> Callable[..., Any]:
    cls = _attr("torch._C._profiler:_ExperimentalConfig")
    cls(profile_all_threads=True)
    return cls


def profile_all_threads_config() -> Any:
    """A torch.profiler experimental config that records every thread, not just the caller."""
    return _get("profiler_all_threads")(profile_all_threads=True)


@_feature(
    "saved_tensor_hooks_top",
    "torch._C._autograd._top_saved_tensors_default_hooks",
    "testing",
    "tests that check a side stream runs under the caller's saved-tensor hooks",
)
def _probe_saved_tensor_hooks_top() -> Callable[[bool], Any]:
    top = _attr("torch._C._autograd:_top_saved_tensors_default_hooks")
    top(True)
    return top


def saved_tensor_hooks_set() -> bool:
    """Whether this thread has saved-tensor default hooks set (``saved_tensors_hooks``)."""
    return _get("saved_tensor_hooks_top")(True) is not None


# --- selftest: the OpInfo sweep ---------------------------------------------------------------


@_feature(
    "opinfo",
    "torch.testing._internal.common_methods_invocations.op_db, common_device_type."
    "toleranceOverride and opinfo.core.DecorateInfo (needs numpy and expecttest)",
    "selftest",
    "sweeping PyTorch's OpInfo database through airstream",
)
def _probe_opinfo() -> tuple[Any, type, type]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op_db = _attr("torch.testing._internal.common_methods_invocations:op_db")
    if not op_db:
        raise LookupError("op_db is empty")
    return (
        op_db,
        _attr("torch.testing._internal.common_device_type:toleranceOverride"),
        _attr("torch.testing._internal.opinfo.core:DecorateInfo"),
    )


def opinfo_database() -> Sequence[Any]:
    """PyTorch's OpInfo database (``op_db``)."""
    return _get("opinfo")[0]


def opinfo_tolerance_decorators() -> tuple[type, type]:
    """``(toleranceOverride, DecorateInfo)``: the classes an OpInfo's tolerances are read from."""
    return _get("opinfo")[1], _get("opinfo")[2]


@_feature(
    "reference_backends",
    "torch._dynamo.backends.debugging.aot_eager and torch._inductor.compile_fx.compile_fx",
    "selftest",
    "the aot_eager and Inductor columns the OpInfo sweep compares airstream with",
)
def _probe_reference_backends() -> tuple[Callable[..., Any], Callable[..., Any]]:
    return (
        _attr("torch._dynamo.backends.debugging:aot_eager"),
        _attr("torch._inductor.compile_fx:compile_fx"),
    )


@_feature(
    "pytree",
    "torch.utils._pytree.tree_flatten and tree_unflatten",
    "selftest",
    "rebuilding an OpInfo sample's arguments around new tensors",
)
def _probe_pytree() -> tuple[Callable[..., Any], Callable[..., Any]]:
    flatten = _attr("torch.utils._pytree:tree_flatten")
    unflatten = _attr("torch.utils._pytree:tree_unflatten")
    leaves, spec = flatten(((1, 2), {"a": 3}))
    if leaves != [1, 2, 3] or unflatten(leaves, spec) != ((1, 2), {"a": 3}):
        raise ValueError("tree_flatten/tree_unflatten do not round-trip")
    return flatten, unflatten


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """torch's pytree flattening: ``(leaves, spec)``."""
    return _get("pytree")[0](tree)


def tree_unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    """The inverse of :func:`tree_flatten`."""
    return _get("pytree")[1](list(leaves), spec)


def aot_eager(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """torch's ``aot_eager`` backend (AOTAutograd, no compiler): the reference column."""
    return _get("reference_backends")[0](gm, example_inputs)


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """Inductor as a Dynamo backend."""
    return _get("reference_backends")[1](gm, list(example_inputs))
