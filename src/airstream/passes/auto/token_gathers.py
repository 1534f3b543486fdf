"""The rules of :mod:`airstream.passes.auto.token_dims` for ops that move rows between tokens or
combine them: gathers and scatters (a MoE layer's dispatch and combine), matrix multiplies, and
the functional collectives. A gather by positions gives the micro-batch's rows permuted; a
scatter-add gives rows back only from a source whose rows stand for the same permutation as its
index (:mod:`airstream.passes.auto.token_labels` says why that is exact)."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from airstream.passes.auto.token_labels import (
    Label,
    Mixed,
    Positions,
    Rows,
    Stop,
    joined,
    matches,
)
from airstream.passes.auto.token_rules import (
    Context,
    Rule,
    elementwise,
    same_shape,
    same_size,
    shape,
    unary,
)
from airstream.torch_internals import multiple_of

__all__ = ["COLLECTIVE_RULES", "GATHER_RULES"]

aten = torch.ops.aten


def _gathered(table: Label, ids: Positions) -> Label:
    """Rows of ``table`` taken at positions ``ids``: each result row stands for the row of
    ``ids``' permutation it was taken for."""
    if not isinstance(table, Rows) or table.dim != 0 or table.by or table.fresh:
        return Stop(
            "it gathers by positions within the micro-batch from a tensor that is not the "
            "micro-batch's rows"
        )
    if table.layout != ids.of:
        return Mixed("a gather by positions of rows laid out otherwise")
    per, blocks = ids.fine
    return Rows(0, per, blocks, by=ids.base)


def index(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``x[i, j, ...]`` (advanced indexing): positions gather rows; ids that are rows look up a
    shared table; shared indices into other dimensions keep rows, at the place the indexing
    moves them to."""
    lab = ctx.of(a["self"])
    indices: list[Any] = list(a["indices"])
    given = [(i, ctx.of(t)) for i, t in enumerate(indices) if t is not None]
    if len(given) == 1 and given[0][0] == 0 and isinstance(given[0][1], Positions):
        return _gathered(lab, given[0][1])
    if _picked_per_row(lab, given, indices):
        return lab
    if any(isinstance(g, (Positions, Mixed)) for _, g in given):
        return Mixed("rows gathered by indices that are not rows")
    if lab is None and len(given) == 1 and given[0][0] == 0 and isinstance(given[0][1], Rows):
        return given[0][1]  # a shared table looked up by ids that are rows
    if not isinstance(lab, Rows) or any(g is not None for _, g in given):
        return Mixed("rows gathered by index")
    places = [i for i, _ in given]
    if lab.dim in places:
        return Mixed("it indexes the token dimension")
    sizes = [shape(indices[i]) for i in places]
    width = max((len(s) for s in sizes if s is not None), default=0)
    if places == list(range(places[0], places[-1] + 1)):  # adjacent: in place
        return lab if lab.dim < places[0] else lab.moved(lab.dim + width - len(places))
    # apart: the indexed dimensions go first, the others keep their order after them
    return lab.moved(width + sum(1 for d in range(lab.dim) if d not in places))


def _picked_per_row(lab: Label, given: list[tuple[int, Label]], indices: list[Any]) -> bool:
    """``x[arange(T), ids]``: row ``j`` of ``x`` at the places row ``j`` of ``ids`` says (the
    first index the micro-batch's own positions in order, the others rows alike)."""
    if not isinstance(lab, Rows) or lab.dim != 0 or not lab.whole or len(given) < 2:
        return False
    first = given[0][1]
    if [i for i, _ in given] != list(range(len(given))) or not isinstance(first, Positions):
        return False
    if first.base or first.fine != lab.layout or first.of != lab.layout:
        return False
    return all(
        isinstance(g, Rows) and g == Rows(0, *lab.layout) and len(shape(indices[i]) or ()) == 1
        for i, g in given[1:]
    )


def index_select(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    lab, ids, src = ctx.of(a["self"]), ctx.of(a["index"]), shape(a["self"])
    dim = int(a["dim"]) % len(src) if src else 0
    if isinstance(ids, Positions) and dim == 0:
        return _gathered(lab, ids)
    if lab is None and isinstance(ids, Rows) and dim == 0 and len(shape(a["index"]) or ()) == 1:
        return ids.moved(0)  # a shared table's rows looked up by ids that are rows
    if isinstance(lab, Rows) and ids is None and dim != lab.dim:
        return lab
    return Mixed("rows selected by index")


def gather(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``x.gather(dim, idx)``: positions along dimension 0 gather rows; an index that is rows
    laid out as ``x``'s, along another dimension, keeps them."""
    lab, ids, src = ctx.of(a["self"]), ctx.of(a["index"]), shape(a["self"])
    dim = int(a["dim"]) % len(src) if src else 0
    if isinstance(ids, Positions) and dim == 0:
        return _gathered(lab, ids)
    if isinstance(lab, Rows) and isinstance(ids, Rows) and lab == ids and dim != lab.dim:
        return lab
    return Mixed("rows gathered by index")


def embedding(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    weight, ids = ctx.of(a["weight"]), ctx.of(a["indices"])
    if weight is None and isinstance(ids, Rows):
        return ids
    return Mixed("an embedding looked up by values that are not rows")


def _combined(
    buffer: Label, dim: int, ids: Label, source: Label, op: str, shared_index: bool = True
) -> Label:
    """A scatter-add of ``source`` into ``buffer`` along ``dim`` at ``ids``: rows where the buffer
    is rows along ``dim``, the index positions into them, and the source's rows stand for the
    same permutation of the same rows as the index's (each token's rows all summed into its
    own row); or, along another dimension, where the source's rows are the buffer's and the
    index is shared (``shared_index``: the op indexes whole rows, ``index_add``) or rows alike
    (``scatter_add``, whose index says which rows it touches)."""
    if not isinstance(buffer, Rows) or buffer.by:
        return Mixed(f"{op} into a buffer that is not rows")
    if isinstance(ids, Positions):
        if buffer.dim != dim or (buffer.layout != ids.of and not buffer.fresh):
            return Mixed(f"{op} at positions of other rows")
        per, blocks = ids.fine
        aligned = Rows(dim, per, blocks, by=ids.base)
        if isinstance(source, Rows) and source == aligned:
            return Rows(dim, *ids.of) if buffer.fresh else buffer
        return Stop(
            f"{op} adds into token rows from a source whose rows are not those its index "
            "positions (each source row must be computed from the row it is added back to)"
        )
    indexed = (ids is None and shared_index) or (isinstance(ids, Rows) and matches(buffer, ids))
    if buffer.dim != dim and indexed and isinstance(source, Rows) and matches(buffer, source):
        return joined(buffer, source)
    return Stop(
        f"{op} adds into token rows at indices that are not the micro-batch's own positions "
        "(from an arange over its rows, or a sort's indices)"
    )


def index_add(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    src = shape(a["self"])
    dim = int(a["dim"]) % len(src) if src else 0
    return _combined(ctx.of(a["self"]), dim, ctx.of(a["index"]), ctx.of(a["source"]), "index_add")


def scatter_add(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    src, ids = shape(a["self"]), a["index"]
    dim = int(a["dim"]) % len(src) if src else 0
    if isinstance(ctx.of(ids), Positions) and not same_shape(shape(ids), shape(a["src"])):
        return Mixed("a scatter_add whose index is not the source's shape")
    lab, source = ctx.of(a["self"]), ctx.of(a["src"])
    return _combined(lab, dim, ctx.of(ids), source, "scatter_add", shared_index=False)


def scatter(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``scatter`` along another dimension than the tokens', by an index that is rows alike:
    each row written from its own row (a sort's backward along a token's row)."""
    lab, ids, src = ctx.of(a["self"]), ctx.of(a["index"]), ctx.of(a.get("src"))
    size = shape(a["self"])
    dim = int(a["dim"]) % len(size) if size else 0
    if not isinstance(lab, Rows) or lab.by or dim == lab.dim:
        return Mixed("a scatter of values that are not rows, or over the tokens")
    if not (isinstance(ids, Rows) and matches(lab, ids)):
        return Mixed("a scatter by an index that is not each row's own")
    if "src" not in a:  # scatter.value: a constant written
        return lab
    if isinstance(src, Rows) and matches(lab, src):
        return joined(lab, src)
    return Mixed("a scatter of a source that is not each row's own")


def index_put(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``x.index_put([p], v, accumulate=True)``: a scatter-add along dimension 0; without
    accumulating, exact only where each position appears once (undivided positions)."""
    indices = list(a["indices"])
    ids = ctx.of(indices[0]) if len(indices) == 1 else Mixed("several indices")
    values, out = ctx.of(a["values"]), shape(node)
    if shape(a["values"]) is None or len(shape(a["values"]) or ()) != len(out or ()):
        return Mixed("index_put of values broadcast over rows")
    if not a["accumulate"] and not (isinstance(ids, Positions) and ids.fine == ids.of):
        return Mixed("index_put without accumulate")
    return _combined(ctx.of(a["self"]), 0, ids, values, "index_put")


def matmul(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``mm``/``addmm``: rows of the left operand (tokens on M) or columns of the right one
    (tokens on N) give rows; tokens on K are summed. ``addmm``'s bias combines as an elementwise
    operand would."""
    left, right = ctx.of(a["mat1" if "mat1" in a else "self"]), ctx.of(a["mat2"])
    if isinstance(left, Rows) and left.dim == 0 and right is None:
        product: Rows = left
    elif left is None and isinstance(right, Rows) and right.dim == 1:
        product = right
    else:
        return Mixed("it contracts over the tokens")
    if node.target is not aten.addmm.default:
        return product
    bias, out = a["self"], shape(node)
    lab = ctx.of(bias)
    if lab is None:
        size = shape(bias) or ()
        at = product.dim - (len(out or ()) - len(size))
        spans = 0 <= at < len(size) and not same_size(size[at], 1)
        return Mixed("a bias that does not depend on the tokens spans them") if spans else product
    if isinstance(lab, Rows) and matches(lab, product):
        return joined(product, lab)
    return Mixed("a bias mixing rows")


def bmm(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """Tokens as the batch (both operands rows alike), on M (a shared right operand) or on N."""
    left, right = ctx.of(a["self"]), ctx.of(a["mat2"])
    if isinstance(left, Rows) and left.dim == 0 and right == left:
        return left
    if isinstance(left, Rows) and left.dim == 1 and right is None:
        return left
    if left is None and isinstance(right, Rows) and right.dim == 2:
        return right
    if isinstance(left, Rows) and left.dim == 0 and right is None:
        return Mixed("a shared operand of a batched matmul spans the tokens")
    return Mixed("a batched matmul over the tokens")


def _rows_in_order(lab: Label) -> Rows | None:
    return lab if isinstance(lab, Rows) and not lab.by else None


def all_reduce(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """Each rank's rows summed with the same rows of every other rank (the ranks hold the same
    tokens in order: tensor parallelism); permuted rows are not the same on every rank."""
    lab = unary(node, a, ctx)
    return lab if _rows_in_order(lab) else Mixed("a collective of values that are not rows")


def all_to_all(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """Blocks of rows, one per rank, exchanged with equal splits: each rank gets every rank's
    block for it, the same layout; any other exchange mixes rows."""
    lab = _rows_in_order(ctx.of(a["input"]))
    splits = [a["output_split_sizes"], a["input_split_sizes"]]
    equal = all(
        isinstance(s, (list, tuple)) and len(s) > 0 and all(_same_size(p, s[0]) for p in s)
        for s in splits
    )
    if lab is not None and lab.dim == 0 and equal and lab.blocks == len(splits[1]):
        return lab
    return Mixed("rows exchanged between ranks (all_to_all_single)")


def _same_size(a: Any, b: Any) -> bool:
    def val(x: Any) -> Any:
        return x.meta.get("val") if isinstance(x, torch.fx.Node) else x

    return a is b or multiple_of(val(a), val(b)) == 1


def all_gather(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """Every rank's value in turn along dimension 0: each rank's runs of rows become as many
    blocks more (another dimension's rows stay rows)."""
    lab, size = _rows_in_order(ctx.of(a["input"])), a["group_size"]
    if lab is not None and lab.dim == 0 and isinstance(size, int):
        return Rows(0, lab.per, lab.blocks * size, lab.fresh)
    if lab is not None and lab.dim > 0:
        return lab
    return Mixed("an all_gather of values that are not rows")


def reduce_scatter(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """The sum over ranks, cut along dimension 0 into one part per rank: rows where the blocks
    divide among the ranks (each part holds its share of them)."""
    lab, size = _rows_in_order(ctx.of(a["input"])), a["group_size"]
    if lab is not None and lab.dim == 0 and isinstance(size, int) and lab.blocks % size == 0:
        return Rows(0, lab.per, lab.blocks // size, lab.fresh)
    if lab is not None and lab.dim > 0:
        return lab
    return Mixed("a reduce_scatter over the token dimension")


def copy(node: torch.fx.Node, a: dict[str, Any], ctx: Context) -> Label:
    """``copy(self, src)``: ``src`` broadcast into ``self``'s shape (an in-place collective's
    result written back: ``dist.all_reduce(t)``)."""
    return elementwise(node, [a["self"], a["src"]], ctx)


GATHER_RULES: dict[Any, Rule] = {
    aten.index.Tensor: index,
    aten.index_select.default: index_select,
    aten.gather.default: gather,
    aten.embedding.default: embedding,
    aten.index_add.default: index_add,
    aten.scatter_add.default: scatter_add,
    aten.scatter.src: scatter,
    aten.scatter.value: scatter,
    aten.index_put.default: index_put,
    aten.mm.default: matmul,
    aten.addmm.default: matmul,
    aten.bmm.default: bmm,
    aten.copy.default: copy,
}
COLLECTIVE_RULES: dict[str, Rule] = {  # by the functional collective's name
    "all_reduce": all_reduce,
    "wait_tensor": unary,
    "all_to_all_single": all_to_all,
    "all_gather_into_tensor": all_gather,
    "reduce_scatter_tensor": reduce_scatter,
}
