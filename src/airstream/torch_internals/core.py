"""Private torch APIs every compile needs: op classes and schemas, fake tensors, the grad-mode
switch, the profiler flag, Dynamo's skip and its eval-frame getter (the node metadata torch's
tracers write is in ``node_meta``, AOTAutograd and its partitioner in ``aot``)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.torch_internals.registry import (
    _attr,
    _bind,
    _feature,
    _get,
    _optional,
)

# torch.distributed functional collectives (``torch.distributed._functional_collectives``)
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional"})


@_feature(
    "op_overload",
    "torch._ops.OpOverload, OpOverloadPacket, OperatorBase and OpOverload._schema, ._opname, "
    "._overloadname",
    "import",
    "recognising aten ops and reading their schemas (mutation, aliasing, names)",
)
def _probe_op_overload() -> tuple[type, type, type]:
    ops = importlib.import_module("torch._ops")
    op = torch.ops.aten.add_.Tensor
    if not isinstance(op, ops.OpOverload):
        raise TypeError("torch.ops.aten.add_.Tensor is not a torch._ops.OpOverload")
    if op._schema.name != "aten::add_" or op._opname != "add_" or op._overloadname != "Tensor":
        raise AttributeError("OpOverload._schema/._opname/._overloadname changed meaning")
    return ops.OpOverload, ops.OpOverloadPacket, ops.OperatorBase


@_feature(
    "fake_tensor",
    "torch._subclasses.fake_tensor.FakeTensor, FakeTensorMode and torch._guards.detect_fake_mode",
    "import",
    "the example inputs passes receive and the metadata airstream fills in",
)
def _probe_fake_tensor() -> tuple[type, type, Callable[..., Any]]:
    fake = importlib.import_module("torch._subclasses.fake_tensor")
    detect = _attr("torch._guards:detect_fake_mode")
    with fake.FakeTensorMode() as mode:
        value = torch.empty(2)
    if not isinstance(value, fake.FakeTensor) or detect([value]) is not mode:
        raise TypeError("detect_fake_mode does not find a FakeTensor's mode")
    return fake.FakeTensor, fake.FakeTensorMode, detect


@_feature(
    "real_tensors",
    "torch._subclasses.fake_tensor.unset_fake_temporarily",
    "collectives",
    "a pass computing on real tensors while AOTAutograd's fake mode is active (ranks agreeing "
    "on microbatch_overlap's split, its split graph checked in a fake mode of its own)",
)
def _probe_real_tensors() -> Callable[[], Any]:
    unset: Callable[[], Any] = _attr("torch._subclasses.fake_tensor:unset_fake_temporarily")
    fake = importlib.import_module("torch._subclasses.fake_tensor")
    with fake.FakeTensorMode(), unset():
        value = torch.empty(2)
    if isinstance(value, fake.FakeTensor):
        raise TypeError("unset_fake_temporarily left the fake mode active")
    return unset


def real_tensors() -> Any:
    """A context in which no fake mode is active: the tensors made in it are real."""
    return _get("real_tensors")()


@_feature(
    "suppress_guards",
    "torch.fx.experimental.symbolic_shapes.ShapeEnv.suppress_guards",
    "collectives",
    "microbatch_overlap's copies given their metadata without guards on the micro-batches' "
    "sizes (a guard s0 // 2 != 1 would recompile the graph for every count of 2 or 3)",
)
def _probe_suppress_guards() -> Callable[[Any], Any]:
    shape_env = _attr("torch.fx.experimental.symbolic_shapes:ShapeEnv")
    if not callable(getattr(shape_env, "suppress_guards", None)):
        raise AttributeError("ShapeEnv.suppress_guards is gone")
    return lambda env: env.suppress_guards()


def guards_suppressed(mode: Any) -> Any:
    """A context in which the fake mode ``mode``'s shape environment records no guard (a
    symbolic comparison takes its example values' answer); a null context for a static mode."""
    env = getattr(mode, "shape_env", None)
    return _get("suppress_guards")(env) if env is not None else contextlib.nullcontext()


@_feature(
    "grad_mode",
    "torch._C._set_grad_enabled",
    "import",
    "following the caller's grad mode on stream worker threads (once per call)",
)
def _probe_grad_mode() -> Callable[[bool], None]:
    fn = _attr("torch._C:_set_grad_enabled")
    before = torch.is_grad_enabled()
    fn(not before)
    flipped = torch.is_grad_enabled()
    fn(before)
    if flipped == before:
        raise RuntimeError("torch._C._set_grad_enabled does not change torch.is_grad_enabled()")
    return fn


@_feature(
    "profiler_flag",
    "torch.autograd.profiler._is_profiler_enabled",
    "import",
    "checking once per compiled call whether torch.profiler records (traced code or plain)",
)
def _probe_profiler_flag() -> Any:
    module = torch.autograd.profiler
    if not isinstance(module._is_profiler_enabled, bool):
        raise TypeError("torch.autograd.profiler._is_profiler_enabled is not a bool")
    return module


@_feature(
    "dynamo_skip",
    "torch._dynamo.decorators.skip",
    "import",
    "keeping airstream.stream's eager-mode check out of Dynamo's tracing",
)
def _probe_dynamo_skip() -> Callable[..., Any]:
    return _attr("torch._dynamo.decorators:skip")


@_feature(
    "impurity",
    "torch._library.utils.is_impure",
    "core",
    "torch's own side-effect rules (side-effectful functions, ops registered as effectful, "
    "higher-order ops such as auto_functionalized), which airstream.graph.effects follows",
)
def _probe_impurity() -> Callable[..., bool]:
    fn = _attr("torch._library.utils:is_impure")
    if not fn(torch.ops.aten._assert_async.msg) or fn(torch.ops.aten.add.Tensor):
        raise RuntimeError("is_impure no longer tells _assert_async from add")
    return fn


def torch_side_effects(target: Any, args: Any = None, kwargs: Any = None) -> bool:
    """torch's verdict on whether calling ``target`` has an effect beyond its result, random
    number draws not counted (``airstream.graph.effects`` decides those from the op's tag)."""
    return bool(_get("impurity")(target, args=args, kwargs=kwargs, impure_random=False))


def is_higher_order(target: Any) -> bool:
    """A higher-order operator (``auto_functionalized``, ``cond``, ...): its effects depend on
    its arguments, not on the target alone."""
    ops = (OpOverload, OpOverloadPacket)
    return isinstance(target, OperatorBase) and not isinstance(target, ops)


if TYPE_CHECKING:  # for the type checker: the classes the probe finds at run time
    from torch._ops import OperatorBase, OpOverload, OpOverloadPacket
else:
    OpOverload, OpOverloadPacket, OperatorBase = _bind("op_overload")
FakeTensor, FakeTensorMode, detect_fake_mode = _bind("fake_tensor")
set_grad_enabled: Callable[[bool], None] = _bind("grad_mode")
dynamo_skip: Callable[..., Any] = _bind("dynamo_skip")
_profiler_module = _bind("profiler_flag")


def profiler_enabled() -> bool:
    """torch.profiler (or torch.autograd.profiler) is recording. One attribute read; unlike the
    thread-local C++ check it is also set with ``profile_all_threads=True``."""
    return _profiler_module._is_profiler_enabled


def op_schema(target: Any) -> torch.FunctionSchema | None:
    """The schema of an aten (or any registered) op overload; None for anything else."""
    return target._schema if isinstance(target, OpOverload) else None


def op_name(target: OpOverload) -> tuple[str, str, str]:
    """``(namespace, name, overload)`` of an op overload: ``("aten", "mm", "default")``."""
    return target.namespace, target._opname, target._overloadname


def collective_op_name(target: Any) -> str | None:
    """``all_reduce``, ``wait_tensor``, ... for a functional-collective op, else None."""
    if isinstance(target, OpOverload) and target.namespace in COLLECTIVE_NAMESPACES:
        return target._opname
    return None


# --- airstream.stream's eager check -----------------------------------------------------------


@_feature(
    "eval_frame_callback",
    "torch._C._dynamo.eval_frame.get_eval_frame_callback",
    "diagnostics",
    "warning when airstream.stream runs eagerly inside a torch.compile'd call (a graph break)",
)
def _probe_eval_frame_callback() -> Callable[[], Any]:
    get = _attr("torch._C._dynamo.eval_frame:get_eval_frame_callback")
    get()
    return get


def eval_frame_callback_getter() -> Callable[[], Any] | None:
    """Dynamo's C function returning its frame hook (set while eager code runs inside a compiled
    call), to be called from a ``dynamo_skip`` frame: being C, it opens no frame Dynamo would
    try to trace. None (after one warning) on a torch without it."""
    return _optional("eval_frame_callback")
