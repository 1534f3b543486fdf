"""Private torch APIs every compile needs: op classes and schemas, fake tensors, the grad-mode
switch, the profiler flag, Dynamo's skip, node metadata torch's tracers write, AOTAutograd and the
min-cut partitioner, and Dynamo's eval-frame getter."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

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
    "higher-order ops such as auto_functionalized), which airstream.effects follows",
)
def _probe_impurity() -> Callable[..., bool]:
    fn = _attr("torch._library.utils:is_impure")
    if not fn(torch.ops.aten._assert_async.msg) or fn(torch.ops.aten.add.Tensor):
        raise RuntimeError("is_impure no longer tells _assert_async from add")
    return fn


def torch_side_effects(target: Any, args: Any = None, kwargs: Any = None) -> bool:
    """torch's verdict on whether calling ``target`` has an effect beyond its result, random
    number draws not counted (``airstream.effects`` decides those from the op's tag)."""
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
