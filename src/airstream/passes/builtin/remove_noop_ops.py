"""Built-in pass: remove view ops that return their input unchanged.

Switch: ``experimental_config.remove_noop_ops`` (default on).

Before::

    view = aten.view.default(mm, [8, 16])        # mm is already [8, 16]
    slice_1 = aten.slice.Tensor(view, 0, 0, 9223372036854775807)
    relu = aten.relu.default(slice_1)

After::

    relu = aten.relu.default(mm)

Two kinds of no-ops are removed:

- views whose result is an alias of their input with identical size, stride and storage offset
  (view, _unsafe_view, reshape, expand, slice over the full range, identity permute, alias);
  ``_unsafe_view`` of a graph input is kept;
- ops that compute a copy equal to one input, with the same size, stride, dtype and device
  (``clone``, ``copy(self, src)`` as ``src``, ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``,
  ``x ** 1``, ``repeat`` by ones, zero ``constant_pad_nd``, ``cat`` of one tensor, a
  full-cover ``slice_scatter``, ``convert_element_type`` to the same dtype,
  ``ceil``/``floor``/``round``/``trunc`` of integers).
  Replacing a copy by its input makes two values share memory, so one is removed only when
  nothing in the graph writes to either of them (or to a view of them), and not when it is a
  graph output whose input is a graph input or another output (the caller would see shared
  memory where eager gives a new tensor).

Air ops are never touched and no node moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airstream.graph.effects import effects

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


def _ints_all(value: Any, want: int) -> bool:
    return isinstance(value, (list, tuple)) and all(v == want for v in value)


def _full_cover(node: torch.fx.Node) -> bool:
    """slice_scatter(self, src, dim, start, end, step) that writes ``src`` over all of self."""
    args = list(node.args) + [None] * 6
    _, _, _, start, end, step = args[:6]
    start = node.kwargs.get("start", start)
    end = node.kwargs.get("end", end)
    step = node.kwargs.get("step", step)
    big_end = end is None or (isinstance(end, int) and end >= 2**62)
    return start in (None, 0) and step in (None, 1) and big_end


def _integral(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and not (val.is_floating_point() or val.is_complex())


def _scalar_is(value: int) -> Callable[[torch.fx.Node], bool]:
    """The node's second argument is the number ``value`` (and no ``alpha``)."""

    def check(node: torch.fx.Node) -> bool:
        other = node.args[1] if len(node.args) > 1 else None
        plain = isinstance(other, (int, float)) and not isinstance(other, bool)
        return plain and bool(other == value) and "alpha" not in node.kwargs

    return check


def _one_tensor(node: torch.fx.Node) -> bool:
    return isinstance(node.args[0], (list, tuple)) and len(node.args[0]) == 1


# op: (the argument the result equals, when the condition on the node holds)
_COPY_OPS: dict[Any, tuple[int | None, Callable[[torch.fx.Node], bool]]] = {
    aten.clone.default: (0, lambda n: True),
    aten.copy.default: (1, lambda n: True),  # copy(self, src): src's values in self's layout
    aten.add.Tensor: (0, _scalar_is(0)),
    aten.sub.Tensor: (0, _scalar_is(0)),
    aten.mul.Tensor: (0, _scalar_is(1)),
    aten.div.Tensor: (0, _scalar_is(1)),
    aten.pow.Tensor_Scalar: (0, _scalar_is(1)),
    aten.repeat.default: (0, lambda n: len(n.args) > 1 and _ints_all(n.args[1], 1)),
    aten.constant_pad_nd.default: (0, lambda n: len(n.args) > 1 and _ints_all(n.args[1], 0)),
    aten.cat.default: (
        None,
        lambda n: isinstance(n.args[0], (list, tuple)) and len(n.args[0]) == 1,
    ),
    aten.slice_scatter.default: (1, _full_cover),
    torch.ops.prims.convert_element_type.default: (0, lambda n: True),
    aten.ceil.default: (0, _integral),
    aten.floor.default: (0, _integral),
    aten.round.default: (0, _integral),
    aten.trunc.default: (0, _integral),
}


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(
        statically_known_true(x == y) for x, y in zip(a, b, strict=True)
    )


def _same_meta(node: torch.fx.Node, src: Any) -> bool:
    if not isinstance(src, torch.fx.Node):
        return False
    out, inp = node.meta.get("val"), src.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(inp, torch.Tensor):
        return False
    return (
        out.dtype == inp.dtype
        and out.device == inp.device
        and _same(out.shape, inp.shape)
        and _same(out.stride(), inp.stride())
    )


def _copy_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input a copy-computing no-op equals, or None."""
    entry = _COPY_OPS.get(node.target)
    if entry is None or not node.args:
        return None
    index, condition = entry
    if index is None:
        first = node.args[0]
        src = first[0] if isinstance(first, (list, tuple)) and first else None
    else:
        src = node.args[index] if index < len(node.args) else None
    if not isinstance(src, torch.fx.Node) or not condition(node) or not _same_meta(node, src):
        return None
    return src


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


def _written(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose memory something in the graph writes: written values and what they view."""
    written: set[torch.fx.Node] = set()
    todo = [w for n in graph.nodes if n.op == "call_function" for w in effects(n).writes]
    while todo:
        node = todo.pop()
        if node in written:
            continue
        written.add(node)
        if node.op == "call_function" and effects(node).view:
            todo += list(effects(node).aliases)
    return written


def _outputs(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return list(graph.find_nodes(op="output")[0].all_input_nodes)


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory ``node`` views (itself when it is not a view)."""
    while node.op == "call_function" and effects(node).view and effects(node).aliases:
        node = effects(node).aliases[0]
    return node


def remove_noop_ops(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
    """Replace each no-op view, and each copy equal to its input where sharing is safe, by its
    input, and erase it."""
    graph = gm.graph
    written = _written(graph)
    outputs = set(_outputs(graph))
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if _is_noop(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            continue
        src = _copy_source(node)
        if src is None or node in written or src in written:
            continue
        if node in outputs and (_base(src).op == "placeholder" or src in outputs):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        if node in outputs:
            outputs.add(src)
