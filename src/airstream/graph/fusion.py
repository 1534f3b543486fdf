"""Which ops a max-autotune segment may hold (:func:`fusible`), and which are matrix multiplies
(BLAS calls either way: :func:`is_matmul`). Both ask :mod:`airstream.graph.effects` what an op
does."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.foreign_ops import matmul_input
from airstream.torch_internals import (
    OpOverload,
    functionalized_arguments,
    is_auto_functionalized,
    op_name,
    op_schema,
)

__all__ = ["MATMULS", "called_op", "fusible", "is_matmul", "matmul_rows", "multiplies_matrices"]

_aten = torch.ops.aten
_FUSIBLE_NAMESPACES = frozenset({"aten", "prims"})


def _is_tensor_value(val: object) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, list | tuple):
        return len(val) > 0 and all(isinstance(v, torch.Tensor) for v in val)
    return False


MATMULS = frozenset(
    {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}
)
"""Matrix multiplies: BLAS calls (Inductor calls them as extern kernels on CPU, not fused)."""


def is_matmul(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a matrix multiply (:data:`MATMULS`)."""
    return node.op == "call_function" and node.target in MATMULS


def called_op(node: torch.fx.Node) -> tuple[OpOverload, dict[str, Any]] | None:
    """The op overload ``node`` calls and its arguments by name: a direct call's, or the op an
    ``auto_functionalized_v2`` call wraps, each argument it writes given as its base."""
    if node.op != "call_function":
        return None
    wrapped = functionalized_arguments(node)
    if wrapped is not None:
        return wrapped
    target = node.target
    schema = op_schema(target)
    if schema is None:
        return None
    named = {a.name: v for a, v in zip(schema.arguments, node.args, strict=False)}
    named.update(node.kwargs)
    return target, named  # type: ignore[return-value]


def multiplies_matrices(node: torch.fx.Node) -> bool:
    """A matrix multiply of torch's (:data:`MATMULS`) or of another library
    (:func:`airstream.graph.foreign_ops.matmul_input`: vLLM's ``onednn_mm``), called directly or
    through ``auto_functionalized_v2``."""
    if is_matmul(node):
        return True
    called = called_op(node)
    return called is not None and matmul_input(*op_name(called[0])[:2]) is not None


def matmul_rows(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node holding a matrix multiply's input rows (``mm``'s first argument, ``addmm``'s
    second, ``onednn_mm``'s ``a``)."""
    if node.target in (_aten.addmm.default, _aten.baddbmm.default):
        source = node.args[1]
    elif is_matmul(node):
        source = node.args[0]
    else:
        called = called_op(node)
        name = None if called is None else matmul_input(*op_name(called[0])[:2])
        source = None if called is None or name is None else called[1].get(name)
    return source if isinstance(source, torch.fx.Node) else None


def fusible(node: torch.fx.Node, inside: set[torch.fx.Node] | frozenset[torch.fx.Node]) -> bool:
    """May ``node`` join a max-autotune segment whose nodes so far are ``inside``?

    Operators with tensor results: aten's and prims', and other libraries' custom ops that write
    none of their inputs (Inductor calls them as fallback kernels), or that write them through
    ``auto_functionalized_v2`` (Inductor calls them in place where it can, as it does for a
    whole graph: vLLM's ``out=`` ops); no airstream op; no random ops (they keep eager's
    generator order); no collectives; no other mutation except ``copy_`` into a graph input (an
    input mutation's write-back); ``getitem`` only of a node already in the segment.
    """
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and source in inside
    if is_auto_functionalized(target):  # its results: the op's (None if it returns nothing),
        val = node.meta.get("val")  # then each written base's new value
        return isinstance(val, list | tuple) and _is_tensor_value([v for v in val if v is not None])
    if not isinstance(target, OpOverload):
        return False
    if not _is_tensor_value(node.meta.get("val")):
        return False
    found = effects(node)
    if found.air or found.random or found.collective or found.collective_wait:
        return False
    if target.namespace not in _FUSIBLE_NAMESPACES:
        return not found.mutates
    if found.mutates:
        dest = node.args[0] if node.args else None
        return (
            target is torch.ops.aten.copy_.default
            and isinstance(dest, torch.fx.Node)
            and dest.op == "placeholder"
        )
    return True
