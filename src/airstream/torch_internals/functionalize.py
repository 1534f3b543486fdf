"""torch's encodings behind airstream's in-place rewriting: what an ``auto_functionalized_v2``
node stands for, and which outputs AOTAutograd rebuilds from inputs at run time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airstream.errors import TorchSupportError
from airstream.torch_internals.core import OpOverload
from airstream.torch_internals.registry import _attr, _feature, _get, _module_reads

__all__ = [
    "FunctionalizedCall",
    "functionalized_arguments",
    "functionalized_call",
    "is_auto_functionalized",
    "outputs_rebuilt_from_inputs",
]


# --- reinplace: custom ops that write their inputs ---------------------------------------------


@_feature(
    "auto_functionalized",
    "torch.ops.higher_order.auto_functionalized_v2(op, _all_bases=[...], _<arg>_base_index=i, "
    "...): its results are the op's returns, then each base's new value",
    "reinplace",
    "calling a custom op that writes graph inputs directly instead of through copies",
)
def _probe_auto_functionalized() -> Any:
    hop = _attr("torch._higher_order_ops.auto_functionalize:auto_functionalized_v2")
    _module_reads("torch._higher_order_ops.auto_functionalize", "_all_bases")
    if torch.ops.higher_order.auto_functionalized_v2 is not hop:
        raise LookupError("torch.ops.higher_order.auto_functionalized_v2 is another object")
    return hop


@dataclass(frozen=True)
class FunctionalizedCall:
    """What an ``auto_functionalized_v2`` node stands for: ``op(**kwargs)`` writing ``bases``.

    ``kwargs`` holds the op's arguments with each written one replaced by its base node, or,
    where the op writes a view of its base, by that view: ``views[name]`` is ``(view_op,
    args)`` to make it (``aten.slice.Tensor`` or ``aten.as_strided.default``, the base first).
    The node's results are ``returns`` slots for the op's result (one, ``None``, when the op
    returns nothing; one per value when it returns several), then each base's new value, in
    order.
    """

    op: OpOverload
    kwargs: Mapping[str, Any]
    bases: tuple[torch.fx.Node, ...]
    returns: int
    views: Mapping[str, tuple[OpOverload, tuple[Any, ...]]] = field(default_factory=dict)


def _covers(base: torch.fx.Node, size: Any, stride: Any, offset: Any) -> bool:
    """Is the view ``as_strided(base, size, stride, offset)`` all of ``base``?"""
    val = base.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(size, list | tuple):
        return False
    if len(size) != val.dim() or len(stride) != val.dim():
        return False
    pairs = [
        *zip(val.shape, size, strict=True),
        *zip(val.stride(), stride, strict=True),
        (val.storage_offset(), offset),
    ]
    return all(statically_known_true(a == b) for a, b in pairs)  # no guard on a symbolic size


def is_auto_functionalized(target: Any) -> bool:
    """Is ``target`` ``auto_functionalized_v2`` (a custom op that writes its inputs, as
    AOTAutograd leaves it for Inductor to call in place)? False on a torch without it."""
    try:
        return target is _get("auto_functionalized")
    except TorchSupportError:
        return False


def functionalized_arguments(node: torch.fx.Node) -> tuple[OpOverload, dict[str, Any]] | None:
    """The op an ``auto_functionalized_v2`` node wraps and its arguments by name, each argument
    it writes given as its base node (view metadata dropped): what the op reads and writes, for
    a cost model; None for any other node."""
    if not node.args or not is_auto_functionalized(node.target):
        return None
    op, kwargs = node.args[0], node.kwargs
    if not isinstance(op, OpOverload):
        return None
    given = kwargs.get("_all_bases")
    bases = list(given) if isinstance(given, list | tuple) else []
    named = {k: v for k, v in kwargs.items() if not k.startswith("_")}
    for key, index in kwargs.items():
        if key.endswith("_base_index") and isinstance(index, int) and index < len(bases):
            named[key[1 : -len("_base_index")]] = bases[index]
    return op, named


_WHOLE = ("whole",)  # _view_of: the argument is all of its base


def _view_of(
    kwargs: Mapping[str, Any], prefix: str, base: torch.fx.Node, others: tuple[str, ...]
) -> tuple[Any, ...] | None:
    """What the view metadata under ``prefix`` makes of ``base``: ``_WHOLE`` (none, an alias,
    or an ``as_strided`` view with the base's own size, stride and offset), ``(view_op, args)``
    for a slice or another ``as_strided`` view, or None for metadata unknown here (a list).
    ``others``: longer prefixes of other written arguments (``_output_block_scale_`` beside
    ``_output_``), whose keys are theirs."""
    mine = [k for k in kwargs if k.startswith(prefix) and not k.startswith(others)]
    keys = {k[len(prefix) :] for k in mine} - {"base_index"}
    if not keys or keys == {"alias"}:
        return _WHOLE
    if keys == {"size", "stride", "storage_offset"}:
        size, stride = kwargs[f"{prefix}size"], kwargs[f"{prefix}stride"]
        offset = kwargs[f"{prefix}storage_offset"]
        if _covers(base, size, stride, offset):
            return _WHOLE
        return (torch.ops.aten.as_strided.default, (base, list(size), list(stride), offset))
    if keys == {"slice_dim", "slice_start", "slice_end"}:
        dim, start, end = (kwargs[f"{prefix}slice_{k}"] for k in ("dim", "start", "end"))
        return (torch.ops.aten.slice.Tensor, (base, dim, start, end))
    return None


def functionalized_call(node: torch.fx.Node) -> FunctionalizedCall | None:
    """The direct call behind an ``auto_functionalized_v2`` node whose written arguments are each
    all of a base (the base itself, an alias, or a view covering it) or a slice or strided view
    of one (several such views may share a base: rotary embedding writes the query and the key
    of one projection); None for anything else (a list of tensors)."""
    if node.op != "call_function" or not node.args:
        return None
    try:
        hop = _get("auto_functionalized")
    except TorchSupportError:  # this torch has none: nothing to rewrite
        return None
    op = node.args[0]
    if node.target is not hop or not isinstance(op, OpOverload):
        return None
    kwargs = dict(node.kwargs)
    bases = kwargs.pop("_all_bases", None)
    if not isinstance(bases, list | tuple) or not all(isinstance(b, torch.fx.Node) for b in bases):
        return None
    call: dict[str, Any] = {}
    views: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    uses: dict[int, list[bool]] = {}  # per base: for each argument writing it, a whole write?
    written = [f"_{a.name}_" for a in op._schema.arguments if f"_{a.name}_base_index" in kwargs]
    for arg in op._schema.arguments:
        prefix = f"_{arg.name}_"
        if f"{prefix}base_index" in kwargs:  # the encoding names each argument the op writes
            index = kwargs.get(f"{prefix}base_index")
            if index is None:  # an optional argument it would write, not given
                call[arg.name] = None
                continue
            if not isinstance(index, int) or not 0 <= index < len(bases):
                return None
            others = tuple(w for w in written if w != prefix and w.startswith(prefix))
            view = _view_of(kwargs, prefix, bases[index], others)
            if view is None:
                return None
            uses.setdefault(index, []).append(view is _WHOLE)
            call[arg.name] = bases[index]
            if view is not _WHOLE:
                views[arg.name] = (view[0], view[1])
        elif arg.name in kwargs:
            call[arg.name] = kwargs[arg.name]
    if len(uses) != len(bases):
        return None
    if any(len(whole) > 1 and any(whole) for whole in uses.values()):
        return None  # one base written whole and through another argument too
    returns = max(1, len(op._schema.returns))
    return FunctionalizedCall(op, call, tuple(bases), returns, views)


@_feature(
    "aot_output_info",
    "torch._guards.TracingContext.try_get().fw_metadata: .output_info[i].output_type "
    "(torch._functorch._aot_autograd.schemas.OutputType.alias_of_input / is_input) and "
    ".num_mutated_inp_runtime_indices",
    "reinplace",
    "telling an output AOTAutograd rebuilds from an input (a view of a mutated input) from a "
    "new tensor the caller owns",
)
def _probe_aot_output_info() -> tuple[Any, tuple[Any, ...]]:
    context = _attr("torch._guards:TracingContext")
    output_type = _attr("torch._functorch._aot_autograd.schemas:OutputType")
    meta = _attr("torch._functorch._aot_autograd.schemas:ViewAndMutationMeta")
    if "output_info" not in getattr(meta, "__dataclass_fields__", {}):
        raise AttributeError("ViewAndMutationMeta has no output_info field")
    return context, (output_type.alias_of_input, output_type.is_input)


def outputs_rebuilt_from_inputs(num_outputs: int) -> frozenset[int]:
    """Positions in the output tuple of the graph AOTAutograd is compiling that its runtime
    replaces with a view of an input (the graph's value only describes the view). Empty when
    unknown: outside a compile, or on a torch without this metadata."""
    try:
        context, rebuilt = _get("aot_output_info")
    except TorchSupportError:
        return frozenset()
    tracing = context.try_get()
    meta = getattr(tracing, "fw_metadata", None)
    if meta is None:
        return frozenset()
    start = getattr(meta, "num_mutated_inp_runtime_indices", None)
    if not isinstance(start, int) or start + len(meta.output_info) > num_outputs:
        return frozenset()
    return frozenset(
        start + i for i, info in enumerate(meta.output_info) if info.output_type in rebuilt
    )
