"""Built-in pass: remove view ops that return their input unchanged.

Switch: ``experimental_config.remove_noop_ops`` (default on).

Before::

    view = aten.view.default(mm, [8, 16])        # mm is already [8, 16]
    slice_1 = aten.slice.Tensor(view, 0, 0, 9223372036854775807)
    relu = aten.relu.default(slice_1)

After::

    relu = aten.relu.default(mm)

Only ops whose result is an alias of their input with identical size, stride and storage offset
are removed (view, _unsafe_view, reshape, expand, slice over the full range, identity permute,
alias), so aliasing between tensors never changes. Ops that compute a copy (``x + 0``,
``clone``) are kept: replacing them by their input would let a later in-place write or the
caller see shared memory. ``_unsafe_view`` of a graph input is kept for the same reason.
Air ops are never touched and no node moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["remove_noop_ops"]

aten = torch.ops.aten

_ALIAS_OPS = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.expand.default,
        aten.slice.Tensor,
        aten.permute.default,
        aten.alias.default,
    }
)


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(
        statically_known_true(x == y) for x, y in zip(a, b, strict=True)
    )


def _is_noop(node: torch.fx.Node) -> bool:
    if node.target not in _ALIAS_OPS or not node.args:
        return False
    src = node.args[0]
    if not isinstance(src, torch.fx.Node):
        return False
    out, inp = node.meta.get("val"), src.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(inp, torch.Tensor):
        return False
    if node.target is aten._unsafe_view.default and src.op == "placeholder":
        return False
    if out.dtype != inp.dtype or out.device != inp.device:
        return False
    return (
        _same(out.shape, inp.shape)
        and _same(out.stride(), inp.stride())
        and statically_known_true(out.storage_offset() == inp.storage_offset())
    )


def remove_noop_ops(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
    """Replace each no-op view by its input and erase it."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and _is_noop(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
