"""Private torch APIs of airstream's tools: the flop counter's formulas (auto_streams), profiler
ranges, explain, functional collectives, the OpInfo sweep and what the test suite needs."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.torch_internals.core import OpOverload
from airstream.torch_internals.registry import (
    _attr,
    _feature,
    _get,
    _takes,
)

_COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "wait_tensor",
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


# --- explain ----------------------------------------------------------------------------------


@_feature(
    "dynamo_explain",
    "torch._dynamo.exc.Unsupported and torch._dynamo.eval_frame.remove_from_cache",
    "explain",
    "finding graph breaks and compiling a model without keeping its compiled code",
)
def _probe_dynamo_explain() -> tuple[type, Callable[[Any], None]]:
    unsupported = _attr("torch._dynamo.exc:Unsupported")
    if not issubclass(unsupported, Exception):
        raise TypeError("torch._dynamo.exc.Unsupported is not an exception")
    return unsupported, _attr("torch._dynamo.eval_frame:remove_from_cache")


def dynamo_unsupported() -> type[Exception]:
    """The exception Dynamo raises for a graph break under ``fullgraph=True``."""
    return _get("dynamo_explain")[0]


def remove_from_dynamo_cache(fn: Any) -> None:
    """Drop Dynamo's compiled code for ``fn`` (the next compile starts afresh)."""
    _get("dynamo_explain")[1](fn)


@_feature(
    "dynamo_frames",
    "torch._dynamo.reset, torch._dynamo.utils.counters['frames'] and "
    "torch._dynamo.decorators.mark_unbacked",
    "testing",
    "airstream selftest microbatch (a fresh Dynamo per graph, its compiles counted) and tests "
    "of unbacked sizes",
)
def _probe_dynamo_frames() -> tuple[Callable[[], None], Any, Callable[..., None]]:
    counters = _attr("torch._dynamo.utils:counters")
    if not hasattr(counters["frames"], "clear"):
        raise TypeError("torch._dynamo.utils.counters['frames'] is not a counter")
    return (
        _attr("torch._dynamo:reset"),
        counters,
        _attr("torch._dynamo.decorators:mark_unbacked"),
    )


def reset_dynamo() -> None:
    """Forget every frame Dynamo compiled, and its compile counts."""
    reset, counters, _ = _get("dynamo_frames")
    reset()
    counters["frames"].clear()


def compiled_frames() -> int:
    """How many frames Dynamo compiled since :func:`reset_dynamo`."""
    return int(_get("dynamo_frames")[1]["frames"]["ok"])


def mark_unbacked(tensor: torch.Tensor, dim: int) -> None:
    """Make ``tensor``'s dimension ``dim`` an unbacked size when Dynamo traces it (0 and 1
    included)."""
    _get("dynamo_frames")[2](tensor, dim)


@_feature("graph_break", "torch._dynamo.graph_break", "testing", "tests that force graph breaks")
def _probe_graph_break() -> Callable[[], None]:
    return _attr("torch._dynamo:graph_break")


def dynamo_graph_break() -> Callable[[], None]:
    """The function that forces a Dynamo graph break where it is called (tests; resolve it
    outside compiled code)."""
    return _get("graph_break")


@_feature(
    "backend_registry",
    "torch._dynamo.backends.registry.lookup_backend",
    "testing",
    "checking that torch.compile(backend='airstream') resolves to airstream's entry point",
)
def _probe_backend_registry() -> Callable[[str], Any]:
    return _attr("torch._dynamo.backends.registry:lookup_backend")


def lookup_backend(name: str) -> Any:
    """The callable torch.compile uses for ``backend=name``."""
    return _get("backend_registry")(name)


@_feature(
    "mark_dynamic",
    "torch._dynamo.mark_dynamic",
    "torchair",
    "torchair.inference.set_dim_gears: the dims it names become dynamic",
)
def _probe_mark_dynamic() -> Callable[..., None]:
    return _attr("torch._dynamo:mark_dynamic")


def mark_dynamic(t: Any, dim: int) -> None:
    """Compile ``t``'s dim ``dim`` as a dynamic size."""
    _get("mark_dynamic")(t, dim)


@_feature(
    "register_backend",
    "torch._dynamo.register_backend and torch._dynamo.list_backends",
    "torchair",
    "torch.compile(backend='npu') in TorchAir scripts, as torch_npu registers it",
)
def _probe_register_backend() -> tuple[Callable[..., Any], Callable[..., Any]]:
    return _attr("torch._dynamo:register_backend"), _attr("torch._dynamo:list_backends")


def register_backend(name: str, compiler_fn: Callable[..., Any]) -> None:
    """Make ``torch.compile(backend=name)`` use ``compiler_fn`` (once; later calls keep the
    first)."""
    register, listed = _get("register_backend")
    if name not in listed(exclude_tags=()):
        register(compiler_fn, name=name)


# --- collectives ------------------------------------------------------------------------------


@_feature(
    "functional_collectives",
    "torch.distributed._functional_collectives and the torch.ops._c10d_functional ops "
    + ", ".join(_COLLECTIVE_OPS),
    "collectives",
    "compiling torch.distributed collectives and the tensor-parallel benchmark",
)
def _probe_functional_collectives() -> Any:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    namespace = torch.ops._c10d_functional
    for name in _COLLECTIVE_OPS:
        getattr(namespace, name).default  # noqa: B018 (resolving the op is the probe)
    module = importlib.import_module("torch.distributed._functional_collectives")
    for name in ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "wait_tensor"):
        getattr(module, name)
    return module


def functional_collectives() -> Any:
    """``torch.distributed._functional_collectives`` (traceable collectives)."""
    return _get("functional_collectives")


@_feature(
    "python_process_group",
    "torch.distributed.ProcessGroup subclassed in Python (allreduce, alltoall_base returning a "
    "torch.distributed._Work), found by name through "
    "torch._C._distributed_c10d._register_process_group",
    "collectives",
    "airstream bench microbatch --comm modelled (communication as a modelled delay)",
)
def _probe_python_process_group() -> Any:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    c10d = importlib.import_module("torch._C._distributed_c10d")
    return torch.distributed.ProcessGroup, torch.distributed._Work, c10d._register_process_group


def python_process_group() -> tuple[Any, Any, Callable[[str, Any], None]]:
    """``(ProcessGroup, Work, register(name, group))``: the base classes of a process group
    written in Python, and the call that lets functional collectives find it by ``name``."""
    found: tuple[Any, Any, Callable[[str, Any], None]] = _get("python_process_group")
    return found


def collective_op(name: str) -> OpOverload:
    """The aten-level op of a functional collective: ``collective_op("all_reduce")``."""
    _get("functional_collectives")
    return getattr(torch.ops._c10d_functional, name).default


@_feature(
    "process_group_by_name",
    "torch.distributed.distributed_c10d._resolve_process_group(group_name)",
    "collectives",
    "microbatch_overlap's ranks agreeing over the process group its collectives name",
)
def _probe_process_group_by_name() -> Callable[[str], Any]:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    resolve: Callable[[str], Any] = _attr(
        "torch.distributed.distributed_c10d:_resolve_process_group"
    )
    return resolve


def process_group(name: str) -> Any:
    """The process group a functional collective names (its ``group_name`` argument)."""
    return _get("process_group_by_name")(name)


@_feature(
    "fake_process_group",
    "torch.testing._internal.distributed.fake_pg.FakeStore",
    "testing",
    "tests of collectives on torch's in-process fake process group",
)
def _probe_fake_process_group() -> type:
    return _attr("torch.testing._internal.distributed.fake_pg:FakeStore")


def fake_store() -> Any:
    """A store for ``dist.init_process_group("fake", ...)``."""
    return _get("fake_process_group")()


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
