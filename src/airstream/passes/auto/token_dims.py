"""Which values of a graph are indexed by tokens: the rule table
:func:`airstream.passes.auto.microbatch.microbatch_overlap` splits a batch by.

A value's label says how it relates to the same value computed on one micro-batch (a slice of
the tokens):

* ``None``: it does not depend on the tokens (a parameter, a constant): both micro-batches share it.
* :class:`Rows` ``(dim, per)``: dimension ``dim`` holds ``per`` rows per token, each depending
  only on its own token: the full value is the two micro-batches' values concatenated along
  ``dim``. ``blocks``: the dimension holds that many such blocks one after another (a token's
  rows sent to every rank, an ``all_gather``'s result: each rank's rows in turn): per
  micro-batch still, but not a concatenation of the two; an ``all_to_all_single`` with equal
  splits exchanges the blocks, a ``reduce_scatter`` or a sum over the blocks makes it rows.
  ``fresh``: a new buffer (``full``) whose rows take the layout of what is written into them.
* :class:`Mixed`: computed from one micro-batch's tokens but not a slice of the full value (a
  partial sum over tokens, tokens sorted by expert, rows exchanged by ``all_to_all_single``):
  valid per micro-batch, never concatenated.
* :data:`SCALAR`: an integer derived from the token count (a dynamic size ``s0 * 2``): each
  micro-batch computes it from its own count.
* :class:`Stop`: an op that must not run per micro-batch (random, data-dependent shapes,
  mutation of a shared buffer, capacity dropping): it and what follows run on the merged batch.

One rule gives :class:`Rows` back from :class:`Mixed`: a scatter-add (``index_add``,
``scatter_add``, ``index_put`` accumulating) into a buffer of the micro-batch's rows, by indices
computed from the micro-batch's own positions (an ``arange`` over its rows, or the indices a
``sort`` returned): a MoE layer's combine. Any other op with no rule here is
:class:`Mixed` (its result stays inside the split region).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.effects import effects
from airstream.nodes import describe
from airstream.torch_internals import OpOverload, collective_op_name, multiple_of

__all__ = ["SCALAR", "Label", "Mixed", "Rows", "Stop", "label_nodes", "rows_of_size"]

aten = torch.ops.aten


@dataclass(frozen=True)
class Rows:
    """Dimension ``dim`` holds ``blocks`` blocks of ``per`` rows per token (``fresh``: a new
    buffer, any layout of that many rows)."""

    dim: int
    per: int = 1
    blocks: int = 1
    fresh: bool = False

    @property
    def whole(self) -> bool:
        """The two micro-batches' values concatenate to the full one."""
        return self.blocks == 1 and not self.fresh

    def moved(self, dim: int) -> Rows:
        return Rows(dim, self.per, self.blocks, self.fresh)


@dataclass(frozen=True)
class Mixed:
    """Per micro-batch, but not a slice of the full value (``why``: the op that mixed it);
    ``of``: its values are positions within the micro-batch's rows laid out as ``of`` (an
    ``arange`` over them, a ``sort``'s indices), which a scatter-add may index such rows by."""

    why: str
    of: Rows | None = None
    at: str = ""  # the op that mixed it (set where it is made)


def _matches(a: Rows, b: Rows) -> bool:
    """Two layouts an elementwise op may combine: equal, or a fresh buffer of as many rows."""
    if a.dim != b.dim:
        return False
    if a.fresh or b.fresh:
        return a.per * a.blocks == b.per * b.blocks
    return a == b


def _joined(a: Rows, b: Rows) -> Rows:
    return b if a.fresh else a


@dataclass(frozen=True)
class Stop:
    """Must not run per micro-batch: ``why``, and ``at``: the op that stopped it (for the
    message that names the node)."""

    why: str
    at: str = ""


SCALAR = "scalar"
Label = None | Rows | Mixed | Stop | str | tuple  # tuple: one label per output

_FACTORIES = {aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format}
_NEW_FACTORIES = {
    aten.new_zeros.default,
    aten.new_empty.default,
    aten.new_ones.default,
    aten.new_full.default,
}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_SAME = {  # one tensor in, the same layout of rows out
    aten.clone.default,
    aten.zeros_like.default,
    aten.full_like.default,
    aten.ones_like.default,
    aten._to_copy.default,
    aten.alias.default,
    aten.detach.default,
    aten.contiguous.default,
    aten.lift_fresh_copy.default,
    aten.relu.default,
    aten.gelu.default,
    aten.silu.default,
    aten.sigmoid.default,
    aten.tanh.default,
}
_REDUCTIONS = {
    aten.sum.dim_IntList,
    aten.mean.dim,
    aten.amax.default,
    aten.amin.default,
    aten.var.correction,
    aten.prod.dim_int,
    aten.max.dim,
    aten.min.dim,
    aten.var_mean.correction,
    aten.argmax.default,
    aten.argmin.default,
    aten.any.dim,
    aten.all.dim,
    aten.logsumexp.default,
    aten.norm.ScalarOpt_dim,
    aten.linalg_vector_norm.default,
}
_ALONG = {  # op(x, dim, ...): rows kept where dim is not the tokens' one
    aten._softmax.default,
    aten._log_softmax.default,
    aten.softmax.int,
    aten.log_softmax.int,
    aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
}
_SCATTER_ADDS = {aten.index_add.default, aten.scatter_add.default, aten.index_put.default}
_DATA_DEPENDENT = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.item.default,
}
_SYM_OPS = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.mod,
    torch.sym_int,
    torch.sym_max,
    torch.sym_min,
    aten.sym_size.int,
    aten.sym_numel.default,
}


def rows_of_size(size: Any, tokens: Any) -> int | None:
    """``size / tokens`` where it is a positive whole number (ints or SymInts), else None."""
    return multiple_of(size, tokens)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _shape(node: Any) -> tuple[Any, ...] | None:
    val = _val(node)
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _dim(dim: Any, ndim: int) -> int:
    return int(dim) % ndim if ndim else 0


def _arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


Rule = Callable[[torch.fx.Node, Mapping[torch.fx.Node, Label], Any], Label]


def label_nodes(
    graph: torch.fx.Graph, sources: Mapping[torch.fx.Node, Label], tokens: Any
) -> dict[torch.fx.Node, Label]:
    """Every node's label, from the placeholders' (``sources``; others: None) forward through
    the rule table; ``tokens``: the token count (an int, or the graph's SymInt)."""
    labels: dict[torch.fx.Node, Label] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            labels[node] = sources.get(node)
        elif node.op == "call_function":
            labels[node] = _named(_label(node, labels, tokens), node)
        else:
            labels[node] = None
    return labels


def _named(lab: Label, node: torch.fx.Node) -> Label:
    """``lab`` with the op that made it named, where it is a new mixed or stopped value."""
    if isinstance(lab, tuple):
        return tuple(_named(part, node) for part in lab)
    if isinstance(lab, (Mixed, Stop)) and not lab.at:
        return dataclasses.replace(lab, at=describe(node))
    return lab


def _label(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    ins = [labels.get(n) for n in node.all_input_nodes]
    stops = [lab for lab in ins if isinstance(lab, Stop)]
    target = node.target
    if target is operator.getitem:
        source = labels.get(node.args[0])  # type: ignore[arg-type]
        if isinstance(source, tuple):
            return source[int(node.args[1])]  # type: ignore[arg-type]
        return source
    if stops:
        return stops[0]
    if target in _FACTORIES or target is aten.arange.default or target is aten.arange.start:
        return _factory(node, labels, tokens)
    if all(lab is None for lab in ins):
        return None
    if target in _DATA_DEPENDENT:
        return Stop("its result's shape (or value on the host) depends on the data")
    found = effects(node)
    if found.random:
        return Stop("it draws random numbers (each micro-batch would draw other ones)")
    if found.writes:
        return Stop("it writes into a buffer the micro-batches would share")
    if target in _SYM_OPS:
        return SCALAR
    if any(isinstance(lab, Mixed) for lab in ins) and target not in _SCATTER_ADDS:
        return _mixed_through(node, ins, labels)
    rule = _RULES.get(target) or _COLLECTIVE_RULES.get(collective_op_name(target) or "")
    if rule is not None:
        return rule(node, labels, tokens)
    if isinstance(target, OpOverload) and torch.Tag.pointwise in target.tags:
        return _pointwise(node, labels, tokens)
    return Mixed(f"no token rule for {target}")


def _positions_indexing(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label]) -> Label:
    """A gather by the micro-batch's positions: valid only from rows laid out as they count
    (a shared tensor holds every token's rows, not the micro-batch's)."""
    if node.target not in (aten.index.Tensor, aten.index_select.default, aten.gather.default):
        return None
    index = node.args[1] if node.target is aten.index.Tensor else node.args[2]
    indices = index if isinstance(index, (list, tuple)) else [index]
    source = labels.get(node.args[0])  # type: ignore[arg-type]
    for ids in indices:
        lab = labels.get(ids) if isinstance(ids, torch.fx.Node) else None
        if not isinstance(lab, Mixed) or lab.of is None:
            continue
        if not isinstance(source, (Rows, Mixed)) or (
            isinstance(source, Rows) and source.per * source.blocks != lab.of.per * lab.of.blocks
        ):
            return Stop(
                "it gathers by positions within the micro-batch from a tensor that is not the "
                "micro-batch's rows"
            )
    return None


def _mixed_through(
    node: torch.fx.Node, ins: Sequence[Label], labels: Mapping[torch.fx.Node, Label]
) -> Label:
    """An op over a :class:`Mixed` value: still per micro-batch; positions stay positions
    through the ops that move them, and an integer division by ``c`` turns positions of rows
    ``c`` per token into positions of rows one per token."""
    first = next(lab for lab in ins if isinstance(lab, Mixed))
    why, at = first.why, first.at
    if node.target in (aten.sort.default, aten.sort.stable, aten.topk.default):
        return (Mixed(why, at=at), Mixed(why, at=at))
    positions = _positions_indexing(node, labels)
    if positions is not None:
        return positions
    self_label = ins[0] if ins else None
    ids = self_label.of if isinstance(self_label, Mixed) else None
    if ids is None:
        return Mixed(why, at=at)
    if node.target in _VIEWS or node.target in _SAME or node.target in _MOVES_IDS:
        return Mixed(why, ids, at)
    if node.target in _DIVIDES and isinstance(node.args[1], int) and ids.per % node.args[1] == 0:
        return Mixed(why, Rows(ids.dim, ids.per // node.args[1], ids.blocks), at)
    return Mixed(why, at=at)


_MOVES_IDS = {
    aten.index.Tensor,
    aten.gather.default,
    aten.index_select.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
}
_DIVIDES = {aten.floor_divide.default, aten.div.Tensor_mode, aten.div.Scalar_mode}


def _factory(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """A new tensor whose leading size is a multiple of the token count: fresh rows (an
    ``arange``: the micro-batch's positions)."""
    shape = _shape(node)
    if not shape:
        return None
    dynamic = any(labels.get(n) == SCALAR for n in node.all_input_nodes)
    if not dynamic and isinstance(tokens, torch.SymInt):
        return None
    per = rows_of_size(shape[0], tokens)
    if per is None:
        return None
    if node.target in (aten.arange.default, aten.arange.start):
        return Mixed("positions of the micro-batch's rows", Rows(0, per))
    return Rows(0, per, fresh=True)


def _pointwise(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """Elementwise with broadcasting: rows where every token input has them at the same
    (right-aligned) dimension and the others do not broadcast over it."""
    out = _shape(node)
    if out is None:
        return Mixed(f"{node.target} has no tensor result")
    found: Rows | None = None
    for arg in node.all_input_nodes:
        lab = labels.get(arg)
        shape = _shape(arg)
        if lab == SCALAR:
            return Mixed("a size derived from the token count enters an elementwise op")
        if shape is None:
            continue
        offset = len(out) - len(shape)
        if isinstance(lab, Rows):
            here = lab.moved(lab.dim + offset)
            if found is not None and not _matches(found, here):
                return Mixed("it combines rows of tokens laid out differently")
            if shape[lab.dim] != out[here.dim]:
                return Mixed("it broadcasts a token's rows")
            found = here if found is None else _joined(found, here)
    if found is None:
        return Mixed("no input holds rows")
    for arg in node.all_input_nodes:  # a shared input must not span the token dimension
        shape = _shape(arg)
        if labels.get(arg) is None and shape is not None:
            at = found.dim - (len(out) - len(shape))
            if 0 <= at < len(shape) and shape[at] != 1:
                return Mixed("a tensor that does not depend on the tokens spans their dimension")
    return found


def _first(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label]) -> Label:
    return labels.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None


def _same(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    return _first(node, labels)


def _view(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """Rows flattened or unflattened within a token's rows, or blocks joined to or split from
    the rows (``[blocks, T, ...]`` <-> ``[blocks * T, ...]``)."""
    lab, src, out = _first(node, labels), _shape(node.args[0]), _shape(node)
    if not isinstance(lab, Rows) or src is None or out is None or not out:
        return Mixed("a view of values that are not rows")
    if lab.dim == 0:
        rows = rows_of_size(out[0], tokens)
        if rows is not None and rows % lab.blocks == 0:
            return Rows(0, rows // lab.blocks, lab.blocks, lab.fresh)
        if lab.blocks > 1 and len(out) > 1 and out[0] == lab.blocks:
            if rows_of_size(out[1], tokens) == lab.per and tuple(src[1:]) == tuple(out[2:]):
                return Rows(1, lab.per)  # [blocks * T, ...] -> [blocks, T, ...]
        return Mixed("a view that splits a token's rows")
    if lab.dim == 1 and isinstance(src[0], int) and len(src) == len(out) + 1:
        if out[0] == src[0] * src[1] and tuple(src[2:]) == tuple(out[1:]):
            return Rows(0, lab.per, src[0] * lab.blocks)  # [blocks, T, ...] -> [blocks * T, ...]
    if tuple(src[: lab.dim + 1]) == tuple(out[: lab.dim + 1]):
        return lab
    return Mixed("a view that moves the token dimension")


def _permute(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("a permutation of values that are not rows")
    if node.target is aten.permute.default:
        order = [_dim(d, len(src)) for d in node.args[1]]  # type: ignore[union-attr]
    else:
        order = list(range(len(src)))
        if node.target is aten.t.default:
            order = order[::-1]
        else:
            a, b = (_dim(d, len(src)) for d in node.args[1:3])
            order[a], order[b] = order[b], order[a]
    return lab.moved(order.index(lab.dim))


def _unsqueeze(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, out = _first(node, labels), _shape(node)
    if not isinstance(lab, Rows) or out is None:
        return Mixed("not rows")
    at = _dim(node.args[1], len(out))
    return lab.moved(lab.dim + (1 if at <= lab.dim else 0))


def _squeeze(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("not rows")
    dims = node.args[1] if len(node.args) > 1 else range(len(src))
    dims = [dims] if isinstance(dims, int) else dims
    gone = {_dim(d, len(src)) for d in dims if src[_dim(d, len(src))] == 1}  # type: ignore[union-attr]
    if lab.dim in gone:
        return Mixed("squeezes the token dimension")
    return lab.moved(lab.dim - sum(1 for d in gone if d < lab.dim))


def _along(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """softmax-like ops over one dimension: rows unless it is the tokens'."""
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("not rows")
    if _dim(node.args[1], len(src)) == lab.dim:
        return Mixed(f"{node.target} runs over the tokens")
    return lab


def _reduction(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("a reduction of values that are not rows")
    dims = _arg(node, 1, "dim")
    if node.target in (aten.var.correction, aten.var_mean.correction):
        dims = node.kwargs.get("dim", dims)
    dims = [dims] if isinstance(dims, int) else dims
    if not dims:
        return Mixed("it reduces over every dimension, the tokens' too")
    gone = {_dim(d, len(src)) for d in dims}
    if lab.dim in gone:
        return Mixed("it reduces over the tokens")
    keep = _arg(node, 2, "keepdim", False) or node.kwargs.get("keepdim", False)
    out = lab if keep else lab.moved(lab.dim - sum(1 for d in gone if d < lab.dim))
    if lab.dim > 0 and gone == {0} and isinstance(src[0], int) and src[0] == lab.blocks:
        out = Rows(lab.dim - (0 if keep else 1), lab.per)  # summed over the blocks: rows
    if node.target in (aten.max.dim, aten.min.dim, aten.var_mean.correction):
        return (out, out)
    return out


def _sortlike(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("not rows")
    dim = _arg(node, 2 if node.target is aten.topk.default else 1, "dim", -1)
    if node.target is aten.sort.stable:
        dim = node.kwargs.get("dim", -1)
    if _dim(dim, len(src)) != lab.dim:
        return (lab, lab) if node.target is not aten.argsort.default else lab
    if node.target is aten.topk.default:
        return Stop("it keeps the top k over the tokens (capacity dropping)")
    sorted_ids = Mixed("sorted over the tokens", lab)
    if node.target is aten.argsort.default:
        return sorted_ids
    return (Mixed("sorted over the tokens"), sorted_ids)


def _cumulative(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("not rows")
    if _dim(node.args[1], len(src)) == lab.dim:
        return Stop("it counts over the tokens (an expert capacity's positions)")
    return lab


def _histogram(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    return Mixed("counts over the tokens")


def _matmul(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """``mm(a, b)``/``addmm(bias, a, b)``: rows of ``a`` give rows; rows of ``b`` are summed."""
    a, b = node.args[-2], node.args[-1]
    la, lb = labels.get(a), labels.get(b)  # type: ignore[arg-type]
    bias = labels.get(node.args[0]) if node.target is aten.addmm.default else None  # type: ignore[arg-type]
    if isinstance(la, Rows) and la.dim == 0 and lb is None and bias is None:
        return la
    return Mixed("it contracts over the tokens")


def _bmm(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    la, lb = labels.get(node.args[0]), labels.get(node.args[1])  # type: ignore[arg-type]
    if isinstance(la, Rows) and la.dim in (0, 1) and (lb is None or (la.dim == 0 and lb == la)):
        return la
    return Mixed("bmm over the tokens")


def _index(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """``x[idx]``: a shared table looked up by token rows gives rows; token rows indexed in
    other dimensions by shared indices keep them."""
    lab = _first(node, labels)
    indices: Sequence[Any] = node.args[1]  # type: ignore[assignment]
    given = [(i, labels.get(t)) for i, t in enumerate(indices) if isinstance(t, torch.fx.Node)]
    if lab is None and len(given) == 1 and given[0][0] == 0 and isinstance(given[0][1], Rows):
        return given[0][1]
    if isinstance(lab, Rows) and all(i != lab.dim and g is None for i, g in given):
        if all(i > lab.dim for i, _ in given):
            return lab
    return Mixed("rows gathered by index")


def _embedding(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    weight, ids = labels.get(node.args[0]), labels.get(node.args[1])  # type: ignore[arg-type]
    if weight is None and isinstance(ids, Rows):
        return ids
    return Mixed("an embedding looked up by values that are not rows")


def _scatter_add(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """The MoE combine: rows added into a buffer of the micro-batch's rows at its own positions."""
    buffer = labels.get(node.args[0])  # type: ignore[arg-type]
    if node.target is aten.index_put.default:
        index_list = node.args[1]
        index = (
            index_list[0]
            if isinstance(index_list, (list, tuple)) and len(index_list) == 1
            else None
        )
        accumulate = _arg(node, 3, "accumulate", False)
        dim = 0
        if not accumulate:
            return Mixed("index_put without accumulate")
    else:
        dim, index = int(node.args[1]), node.args[2]  # type: ignore[arg-type]
    ids = labels.get(index) if isinstance(index, torch.fx.Node) else None
    if not isinstance(buffer, Rows) or buffer.dim != dim:
        return Mixed("a scatter into a buffer that is not rows")
    if isinstance(ids, Mixed) and ids.of is not None and _matches(buffer, ids.of.moved(dim)):
        return _joined(buffer, ids.of.moved(dim))
    return Stop(
        f"{node.target} adds into token rows at indices that are not the micro-batch's own "
        "positions (from an arange over its rows, or a sort's indices)"
    )


def _cat(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    parts = [labels.get(p) for p in node.args[0]]  # type: ignore[union-attr,arg-type]
    out = _shape(node)
    dim = _dim(_arg(node, 1, "dim", 0), len(out) if out else 1)
    if parts and all(isinstance(p, Rows) and p == parts[0] and p.dim != dim for p in parts):
        return parts[0]
    return Mixed("a concatenation mixing rows")


def _split(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("not rows")
    dim = _dim(_arg(node, 2, "dim", 0), len(src))
    if dim == lab.dim:
        return Mixed("a split of the token dimension")
    return tuple(lab for _ in node.meta.get("val", ()))


def _slice(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src = _first(node, labels), _shape(node.args[0])
    if not isinstance(lab, Rows) or src is None:
        return Mixed("not rows")
    dim = _dim(_arg(node, 1, "dim", 0), len(src))
    if dim != lab.dim:
        if node.target is aten.select.int:
            return lab.moved(lab.dim - (1 if dim < lab.dim else 0))
        return lab
    return Mixed("a slice of the token dimension")


def _expand(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, src, out = _first(node, labels), _shape(node.args[0]), _shape(node)
    if not isinstance(lab, Rows) or src is None or out is None:
        return Mixed("not rows")
    here = lab.moved(lab.dim + len(out) - len(src))
    return here if src[lab.dim] == out[here.dim] else Mixed("it broadcasts a token's rows")


def _all_to_all(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    """Blocks of rows, one per rank, exchanged with equal splits: each rank gets every rank's
    block for it, the same layout; any other exchange mixes rows."""
    lab = _first(node, labels)
    splits = [node.args[1], node.args[2]]
    equal = all(
        isinstance(s, (list, tuple)) and len(s) > 0 and all(_same_size(p, s[0]) for p in s)
        for s in splits
    )
    if isinstance(lab, Rows) and lab.dim == 0 and equal and lab.blocks == len(node.args[1]):  # type: ignore[arg-type]
        return lab
    return Mixed("rows exchanged between ranks (all_to_all_single)")


def _same_size(a: Any, b: Any) -> bool:
    return a is b or multiple_of(_val(a), _val(b)) == 1


def _all_gather(node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any) -> Label:
    lab, size = _first(node, labels), node.args[1]
    if isinstance(lab, Rows) and lab.dim == 0 and lab.blocks == 1 and isinstance(size, int):
        return Rows(0, lab.per, size)  # each rank's rows in turn
    if isinstance(lab, Rows) and lab.dim > 0:
        return lab
    return Mixed("an all_gather of values that are not rows")


def _reduce_scatter(
    node: torch.fx.Node, labels: Mapping[torch.fx.Node, Label], tokens: Any
) -> Label:
    lab, size = _first(node, labels), node.args[2]
    if isinstance(lab, Rows) and lab.dim == 0 and lab.blocks == size:
        return Rows(0, lab.per)  # this rank's block of the summed rows
    if isinstance(lab, Rows) and lab.dim > 0:
        return lab
    return Mixed("a reduce_scatter over the token dimension")


_RULES: dict[Any, Rule] = {
    **{op: _same for op in _SAME},
    **{op: _view for op in _VIEWS},
    **{op: _reduction for op in _REDUCTIONS},
    **{op: _along for op in _ALONG},
    **{op: _scatter_add for op in _SCATTER_ADDS},
    aten.permute.default: _permute,
    aten.t.default: _permute,
    aten.transpose.int: _permute,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze,
    aten.mm.default: _matmul,
    aten.addmm.default: _matmul,
    aten.bmm.default: _bmm,
    aten.index.Tensor: _index,
    aten.embedding.default: _embedding,
    aten.sort.default: _sortlike,
    aten.sort.stable: _sortlike,
    aten.argsort.default: _sortlike,
    aten.topk.default: _sortlike,
    aten.cumsum.default: _cumulative,
    aten.histc.default: _histogram,
    aten.bincount.default: _histogram,
    aten.cat.default: _cat,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.slice.Tensor: _slice,
    aten.select.int: _slice,
    aten.expand.default: _expand,
    **{op: _factory for op in _NEW_FACTORIES},
}
_COLLECTIVE_RULES: dict[str, Rule] = {  # by the functional collective's name
    "all_reduce": _same,
    "wait_tensor": _same,
    "all_to_all_single": _all_to_all,
    "all_gather_into_tensor": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter,
}
