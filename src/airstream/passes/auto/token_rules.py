"""The rule table of :mod:`airstream.passes.auto.token_dims`: for each aten op, its output's label
(:mod:`airstream.passes.auto.token_labels`) from its inputs'. Every rule reads its op's arguments
by their schema's names (:func:`airstream.graph.nodes.bound_arguments`), and claims rows only where
each output row is a function of its own token's rows; anything else is mixed. Views, permutes
and the ops over one dimension are here; slices, splits and joins are in
:mod:`airstream.passes.auto.token_slices`; gathers, scatters, matrix multiplies and collectives
in :mod:`airstream.passes.auto.token_gathers`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.passes.auto.token_labels import (
    SCALAR,
    Label,
    Mixed,
    Positions,
    Rows,
    Stop,
    joined,
    matches,
)
from airstream.torch_internals import multiple_of

__all__ = [
    "Context",
    "Rule",
    "VIEW_RULES",
    "dim_of",
    "rows_of_size",
    "same_shape",
    "same_size",
    "shape",
    "unary",
]

aten = torch.ops.aten


@dataclass(frozen=True)
class Context:
    """What a rule reads besides its node: every earlier node's label, the token count (an
    int, or the graph's SymInt), and whether a static graph's factories whose leading size is
    a multiple of the count are read as rows (else as shared: both are exact, see
    :func:`factory`)."""

    labels: Mapping[torch.fx.Node, Label]
    tokens: Any
    factory_rows: bool = True

    def of(self, value: Any) -> Label:
        """The label of an argument (None for a constant)."""
        return self.labels.get(value) if isinstance(value, torch.fx.Node) else None


Rule = Callable[[torch.fx.Node, dict[str, Any], Context], Label]


def rows_of_size(size: Any, tokens: Any) -> int | None:
    """``size / tokens`` where it is a positive whole number (ints or SymInts), else None."""
    return multiple_of(size, tokens)


def shape(value: Any) -> tuple[Any, ...] | None:
    """A node's tensor shape (from its ``val``), else None."""
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def same_size(a: Any, b: Any) -> bool:
    """Whether two sizes are the same, without a guard (a symbolic size is the same only as the
    same expression; an unbacked one may not even be compared)."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        if not (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt)):
            return False
        return bool(a.node.expr == b.node.expr)
    return bool(a == b)


def same_shape(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    if a is None or b is None or len(a) != len(b):
        return False
    return all(same_size(x, y) for x, y in zip(a, b, strict=True))


def dim_of(dim: Any, ndim: int) -> int:
    return int(dim) % ndim if ndim else 0


def _dims(dims: Any, ndim: int) -> set[int]:
    """A ``dim`` argument as a set of dimensions (None or [] for a reduction: all of them)."""
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return set(range(ndim))
    dims = [dims] if isinstance(dims, int) else dims
    return {dim_of(d, ndim) for d in dims}


def unary(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """The label of an op's first tensor argument, the op's own (``clone``, ``_to_copy``, ...)."""
    return ctx.of(next(iter(a.values()), None))


def elementwise(
    node: torch.fx.Node, inputs: Sequence[Any], ctx: Context, out: tuple[Any, ...] | None = None
) -> Label:
    """Elementwise over ``inputs`` with broadcasting: rows where every token input has them at
    the same (right-aligned) dimension and no other input spans that dimension."""
    out = shape(node) if out is None else out
    if out is None:
        return Mixed(f"{node.target} has no tensor result")
    found: Rows | None = None
    for value in inputs:
        lab, size = ctx.of(value), shape(value)
        if isinstance(lab, Mixed):
            return lab
        if isinstance(lab, Positions):
            return Mixed("positions within the micro-batch used as values")
        if not isinstance(lab, Rows) or size is None:
            continue
        here = lab.moved(lab.dim + len(out) - len(size))
        if found is not None and not matches(found, here):
            return Mixed("it combines rows of tokens laid out differently")
        if not same_size(size[lab.dim], out[here.dim]):
            return Mixed("it broadcasts a token's rows")
        found = here if found is None else joined(found, here)
    if found is None:
        return Mixed("no input holds rows")
    for value in inputs:  # a shared input must not span the token dimension
        size = shape(value)
        if ctx.of(value) in (None, SCALAR) and size is not None:
            at = found.dim - (len(out) - len(size))
            if 0 <= at < len(size) and not same_size(size[at], 1):
                return Mixed("a tensor that does not depend on the tokens spans their dimension")
    return found


def pointwise(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """An op torch tags pointwise (and ``copy``: its source broadcast into its shape)."""
    return elementwise(node, node.all_input_nodes, ctx)


def _outer(sizes: Sequence[Any]) -> int | None:
    """The product of static sizes, None where one is symbolic."""
    if not all(isinstance(s, int) for s in sizes):
        return None
    return math.prod(sizes)


def view(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """A reshape: rows stay rows where each token's elements stay together (flattened with or
    split into the dimensions after the token's, the runs before it joined to or split from it).
    Element order is row-major: before the token dimension lie ``outer`` runs of the tokens (its
    leading sizes times its blocks), each token holding ``per * inner`` elements."""
    lab, src, out = ctx.of(a["self"]), shape(a["self"]), shape(node)
    if src is None or out is None:
        return Mixed("a view of values that are not tensors")
    if isinstance(lab, Positions):
        if out and src and same_size(out[0], src[0]):
            return lab  # each row's positions stay in its row
        return Mixed("a view of positions across rows")
    if not isinstance(lab, Rows):
        return Mixed("a view of values that are not rows")
    if len(out) > lab.dim and same_shape(src[: lab.dim + 1], out[: lab.dim + 1]):
        return lab  # only the dimensions after the token's change
    outer, inner = _outer(src[: lab.dim]), _outer(src[lab.dim + 1 :])
    if outer is None or inner is None:
        return Mixed("a view of rows whose other sizes are symbolic")
    outer *= lab.blocks
    for d in range(len(out)):
        before, after = _outer(out[:d]), _outer(out[d + 1 :])
        if before is None or after is None or outer % before or (lab.per * inner) % after:
            continue
        blocks, per = outer // before, lab.per * inner // after
        if rows_of_size(out[d], ctx.tokens) != blocks * per:
            continue
        if lab.by and (per, blocks) != lab.layout:
            return Mixed("a view that regroups permuted rows")
        return Rows(d, per, blocks, lab.fresh, lab.by)
    return Mixed("a view that splits a token's rows")


def permute(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, (Rows, Positions)):
        return Mixed("a permutation of values that are not rows")
    order = list(range(len(src)))
    if node.target is aten.permute.default:
        order = [dim_of(d, len(src)) for d in a["dims"]]
    elif node.target is aten.t.default:
        order = order[::-1]
    else:
        x, y = dim_of(a["dim0"], len(src)), dim_of(a["dim1"], len(src))
        order[x], order[y] = order[y], order[x]
    if isinstance(lab, Positions):
        return lab if order[0] == 0 else Mixed("positions moved off their rows")
    return lab.moved(order.index(lab.dim))


def unsqueeze(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    lab, out = ctx.of(a["self"]), shape(node)
    if out is None or not isinstance(lab, (Rows, Positions)):
        return Mixed("an unsqueeze of values that are not rows")
    at = dim_of(a["dim"], len(out))
    if isinstance(lab, Positions):
        return lab if at > 0 else Mixed("positions moved off their rows")
    return lab.moved(lab.dim + (1 if at <= lab.dim else 0))


def squeezed(node: torch.fx.Node) -> list[int]:
    """The dimensions a squeeze removed from its input (its val's shapes say: a micro-batch's
    copy squeezes these and no more, so a one-token micro-batch keeps its token dimension)."""
    src, out = shape(node.args[0]), shape(node)
    if src is None or out is None:
        return []
    dims = range(len(src))
    if node.target is not aten.squeeze.default:
        given = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = sorted(_dims(given, len(src))) if src else []  # type: ignore[assignment]
    gone = [d for d in dims if isinstance(src[d], int) and src[d] == 1]
    return gone if len(src) - len(gone) == len(out) else []


def squeeze(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    lab = ctx.of(a["self"])
    if not isinstance(lab, (Rows, Positions)):
        return Mixed("a squeeze of values that are not rows")
    gone = squeezed(node)
    if isinstance(lab, Positions):
        return lab if 0 not in gone else Mixed("positions squeezed off their rows")
    if lab.dim in gone:
        return Mixed("it squeezes the token dimension")
    return lab.moved(lab.dim - sum(1 for d in gone if d < lab.dim))


def expand(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    lab, src, out = ctx.of(a["self"]), shape(a["self"]), shape(node)
    if src is None or out is None or not isinstance(lab, (Rows, Positions)):
        return Mixed("an expand of values that are not rows")
    if isinstance(lab, Positions):
        kept = len(out) == len(src) and same_size(out[0], src[0])
        return lab if kept else Mixed("positions expanded")
    here = lab.moved(lab.dim + len(out) - len(src))
    kept = same_size(src[lab.dim], out[here.dim])
    return here if kept else Mixed("it broadcasts a token's rows")


def along(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """softmax-like ops over one dimension (their backward's two tensors alike): rows unless
    it is the tokens'."""
    tensors = [v for v in a.values() if isinstance(v, torch.fx.Node)]
    lab = elementwise(node, tensors, ctx)
    if not isinstance(lab, Rows):
        return lab
    out = shape(node) or ()
    if dim_of(a["dim"], len(out)) == lab.dim:
        return Mixed("runs over the tokens")
    return lab


_MULTI = {aten.max.dim, aten.min.dim, aten.var_mean.correction, aten.std_mean.correction}


def reduction(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """A reduction over ``dim`` (all dimensions where it is None or empty)."""
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, Rows):
        return Mixed("a reduction of values that are not rows")
    gone = _dims(a.get("dim"), len(src))
    if lab.dim in gone:
        return Mixed("it reduces over the tokens")
    out = lab if a.get("keepdim") else lab.moved(lab.dim - sum(1 for d in gone if d < lab.dim))
    return (out, out) if node.target in _MULTI else out


def sortlike(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """sort/argsort/topk: along a token's row, rows; over the tokens of a one-dimensional value,
    a sort's indices are positions (a permutation of the micro-batch's rows) and its values
    those rows permuted; the top k over the tokens is capacity dropping."""
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, Rows):
        return Mixed("a sort of values that are not rows")
    indices_only = node.target in (aten.argsort.default, aten.argsort.stable)
    if dim_of(a["dim"], len(src)) != lab.dim:
        return lab if indices_only else (lab, lab)
    if node.target is aten.topk.default:
        return Stop("it keeps the top k over the tokens (capacity dropping)")
    if len(src) != 1 or lab.fresh or lab.by:
        return Mixed("sorted over the tokens")
    # blocks of rows (every rank's copy of the tokens) sort as one value: the positions index
    # the micro-batch's own rows in that layout, which the gathers and scatters check
    order = Positions(node.name, lab.layout, lab.layout)
    return order if indices_only else (Rows(0, lab.per, lab.blocks, by=node.name), order)


def cumulative(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    lab, src = ctx.of(a["self"]), shape(a["self"])
    if src is None or not isinstance(lab, Rows):
        return Mixed("a running total of values that are not rows")
    if dim_of(a["dim"], len(src)) == lab.dim:
        return Stop("it counts over the tokens (an expert capacity's positions)")
    return (lab, lab) if node.target in (aten.cummax.default, aten.cummin.default) else lab


def floor_divided(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """Positions of rows ``per`` per token divided by ``c`` (``per % c == 0``): positions of rows
    ``per // c`` per token; any other division of positions is a value."""
    lab, divisor = ctx.of(a["self"]), a.get("other")
    if node.target is aten.div.Tensor_mode and a.get("rounding_mode") != "floor":
        divisor = None
    if isinstance(lab, Positions) and isinstance(divisor, int) and divisor > 0:
        per, blocks = lab.of
        if per % divisor == 0:
            return Positions(lab.base, lab.fine, (per // divisor, blocks))
    return pointwise(node, a, ctx)


def layer_norm(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``native_layer_norm`` over its last dimensions: rows (and its mean and rstd) where the
    token dimension is not one of them."""
    lab, src = ctx.of(a["input"]), shape(a["input"])
    weights = [ctx.of(a.get(name)) for name in ("weight", "bias")]
    if src is None or not isinstance(lab, Rows) or any(w is not None for w in weights):
        return Mixed("a layer norm of values that are not rows")
    if lab.dim >= len(src) - len(a["normalized_shape"]):
        return Mixed("a layer norm over the tokens")
    return (lab, lab, lab)


def layer_norm_backward(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """The input's gradient is rows where the forward's were; the weight's and bias's sum over
    the tokens."""
    tensors = [a[name] for name in ("grad_out", "input", "mean", "rstd")]
    out = shape(a["input"])
    lab = elementwise(node, tensors, ctx, out)
    if not isinstance(lab, Rows) or out is None or ctx.of(a.get("weight")) is not None:
        return Mixed("a layer norm's gradient over values that are not rows")
    if lab.dim >= len(out) - len(a["normalized_shape"]):
        return Mixed("a layer norm over the tokens")
    summed = Mixed("a weight's gradient sums over the tokens")
    return (lab, summed, summed)


def factory(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """A new tensor whose size follows the token count: fresh rows there (an ``arange``: the
    micro-batch's positions). A dynamic graph says which sizes follow (a multiple of the count's
    symbol). A static graph's sizes cannot tell: a leading size that is a multiple of the count
    is read as rows where ``ctx.factory_rows`` says so, else as shared; both readings are exact
    (a buffer of constants has every row alike; an ``arange`` read as positions indexes only
    the micro-batch's own rows), and the pass keeps the one that splits more."""
    out = shape(node)
    symbolic = isinstance(ctx.tokens, torch.SymInt)
    if not out or not (symbolic or ctx.factory_rows):
        return None
    dims = range(len(out)) if symbolic else range(1)
    for d in dims:
        per = rows_of_size(out[d], ctx.tokens)
        if per is None or (symbolic and not isinstance(out[d], torch.SymInt)):
            continue
        if node.target in (aten.arange.default, aten.arange.start):
            if node.target is aten.arange.start and a.get("start") != 0:
                return Mixed("an arange that does not start at 0")
            return Positions("", (per, 1), (per, 1))
        return Rows(d, per, fresh=True)
    return None


VIEW_RULES: dict[Any, Rule] = {
    aten.view.default: view,
    aten._unsafe_view.default: view,
    aten.reshape.default: view,
    aten.permute.default: permute,
    aten.t.default: permute,
    aten.transpose.int: permute,
    aten.unsqueeze.default: unsqueeze,
    aten.squeeze.default: squeeze,
    aten.squeeze.dim: squeeze,
    aten.squeeze.dims: squeeze,
    aten.expand.default: expand,
    aten.native_layer_norm.default: layer_norm,
    aten.native_layer_norm_backward.default: layer_norm_backward,
    aten.floor_divide.default: floor_divided,
    aten.div.Tensor_mode: floor_divided,
}
