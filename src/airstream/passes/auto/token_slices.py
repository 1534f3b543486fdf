"""Rules of :mod:`airstream.passes.auto.token_dims` for the ops that cut or join along a
dimension: ``slice``/``select``, ``split``/``unbind``, ``cat``, ``stack``, ``constant_pad_nd`` and
``slice_scatter``/``select_scatter``. Along another dimension than the tokens' they keep rows;
along the tokens' only a slice that keeps the dimension whole does (``x[:n]`` with ``n`` its
size, the count in a dynamic graph)."""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.fx

from airstream.passes.auto.token_labels import Label, Mixed, Positions, Rows, joined, matches
from airstream.passes.auto.token_rules import Context, Rule, dim_of, same_size, shape
from airstream.torch_internals import multiple_of

__all__ = ["SLICE_RULES"]

aten = torch.ops.aten


def sliced(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``slice``/``select`` of another dimension keep rows; a slice of the token dimension
    that keeps it whole (``x[:n]`` with ``n`` its size) is the value itself."""
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, (Rows, Positions)):
        return Mixed("a slice of values that are not rows")
    dim = dim_of(a["dim"], len(src))
    token_dim = 0 if isinstance(lab, Positions) else lab.dim
    if dim != token_dim:
        if node.target is aten.select.int and isinstance(lab, Rows):
            return lab.moved(lab.dim - (1 if dim < lab.dim else 0))
        return lab
    if node.target is aten.slice.Tensor and _whole_slice(a, src[dim]):
        return lab
    return Mixed("a slice of the token dimension")


def _at_least(end: Any, size: Any) -> bool:
    value = end.meta.get("val") if isinstance(end, torch.fx.Node) else end
    if isinstance(value, int) and value >= sys.maxsize // 2:  # ``x[a:]``: to the end
        return True
    if isinstance(value, int) and isinstance(size, int):
        return value >= size
    return value is size or (isinstance(value, torch.SymInt) and multiple_of(value, size) == 1)


def split(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """split/split_with_sizes/unbind along another dimension: rows in each part."""
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, Rows):
        return Mixed("a split of values that are not rows")
    dim = dim_of(a.get("dim", 0), len(src))
    if dim == lab.dim:
        return Mixed("a split of the token dimension")
    part = lab.moved(lab.dim - 1) if node.target is aten.unbind.int and dim < lab.dim else lab
    return tuple(part for _ in node.meta.get("val", ()))


def cat(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    parts = [ctx.of(p) for p in a["tensors"]]
    out = shape(node)
    dim = dim_of(a["dim"], len(out) if out else 1)
    if parts and all(isinstance(p, Rows) and p == parts[0] and p.dim != dim for p in parts):
        return parts[0]
    return Mixed("a concatenation mixing rows")


def stack(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """Rows alike stacked along a new dimension: still each token's own."""
    parts = [ctx.of(p) for p in a["tensors"]]
    out = shape(node)
    if not out or not parts or not all(isinstance(p, Rows) and p == parts[0] for p in parts):
        return Mixed("a stack mixing rows")
    lab = parts[0]
    assert isinstance(lab, Rows)
    dim = dim_of(a["dim"], len(out))
    return lab.moved(lab.dim + (1 if dim <= lab.dim else 0))


def pad(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``constant_pad_nd``: rows where the token dimension is not padded."""
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, Rows):
        return Mixed("a pad of values that are not rows")
    widths = list(a["pad"])
    at = 2 * (len(src) - 1 - lab.dim)  # pairs from the last dimension backwards
    if at < len(widths) and any(not same_size(w, 0) for w in widths[at : at + 2]):
        return Mixed("it pads the token dimension")
    return lab


def slice_scatter(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``slice_scatter``/``select_scatter`` into another dimension: rows where both are (the
    result holds the source's rows: a fresh buffer takes their layout); over the whole token
    dimension (``y[:, :4] = v`` in a dynamic graph), the same."""
    lab, src, out = ctx.of(a["self"]), ctx.of(a["src"]), shape(node)
    if out is None or not isinstance(lab, Rows):
        return Mixed("a slice written into values that are not rows")
    dim = dim_of(a["dim"], len(out))
    if node.target is aten.select_scatter.default and isinstance(src, Rows):
        src = src.moved(src.dim + (1 if dim <= src.dim else 0))
    if dim == lab.dim and not _whole_slice(a, out[dim]):
        return Mixed("a slice of the token dimension written")
    if isinstance(src, Rows) and matches(lab, src):
        return joined(lab, src)
    size = shape(a["src"])
    if src is None and size is not None and dim != lab.dim:
        spans = len(size) == len(out) and not same_size(size[lab.dim], 1)
        return Mixed("a shared slice spans the tokens") if spans else lab
    return Mixed("a slice of other rows written")


def _whole_slice(a: dict[str, Any], size: Any) -> bool:
    """A slice's arguments that keep a dimension of ``size`` whole."""
    if "step" not in a or a["step"] != 1 or a.get("start") not in (None, 0):
        return False
    end = a.get("end")
    return end is None or _at_least(end, size)


SLICE_RULES: dict[Any, Rule] = {
    aten.slice.Tensor: sliced,
    aten.select.int: sliced,
    aten.split.Tensor: split,
    aten.split_with_sizes.default: split,
    aten.unbind.int: split,
    aten.cat.default: cat,
    aten.stack.default: stack,
    aten.constant_pad_nd.default: pad,
    aten.slice_scatter.default: slice_scatter,
    aten.select_scatter.default: slice_scatter,
}
