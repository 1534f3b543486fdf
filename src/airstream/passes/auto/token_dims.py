"""Which values of a graph are indexed by tokens: every node's label
(:mod:`airstream.passes.auto.token_labels`: shared, a size, rows, positions, mixed or stop),
from the inputs' forward through the rule table (:mod:`~airstream.passes.auto.token_rules`,
:mod:`~airstream.passes.auto.token_gathers`), which
:func:`airstream.passes.auto.microbatch.microbatch_overlap` splits a batch by.

Before any rule: a mixed input makes the result mixed (nothing computed from a mixed value is
rows again); positions may only index rows (gathers, scatter-adds) or pass through the ops that
keep them positions; an op with an effect beyond its result (random draws, writes, an assertion,
another library's shared state, a data-dependent shape) stops. An op with no rule mixes.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import Effects, effects
from airstream.graph.nodes import bound_arguments, describe
from airstream.passes.auto.token_gathers import COLLECTIVE_RULES, GATHER_RULES
from airstream.passes.auto.token_labels import (
    SCALAR,
    Label,
    Mixed,
    Positions,
    Rows,
    Stop,
)
from airstream.passes.auto.token_rules import (
    VIEW_RULES,
    Context,
    Rule,
    along,
    cumulative,
    factory,
    pointwise,
    reduction,
    rows_of_size,
    sortlike,
    unary,
)
from airstream.passes.auto.token_slices import SLICE_RULES
from airstream.torch_internals import OpOverload, collective_op_name

__all__ = [
    "SCALAR",
    "Label",
    "Mixed",
    "Positions",
    "Rows",
    "Stop",
    "label_nodes",
    "rows_of_size",
]

aten = torch.ops.aten

_FACTORIES = {
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.arange.default,
    aten.arange.start,
    aten.new_zeros.default,
    aten.new_empty.default,
    aten.new_ones.default,
    aten.new_full.default,
}
_KEEPS_POSITIONS = {  # one tensor in, the same values out
    aten.clone.default,
    aten._to_copy.default,
    aten.alias.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
}
_SAME = {  # one tensor in, the same layout of rows out
    *_KEEPS_POSITIONS,
    aten.zeros_like.default,
    aten.full_like.default,
    aten.ones_like.default,
}
_REDUCTIONS = {
    aten.sum.dim_IntList,
    aten.mean.dim,
    aten.amax.default,
    aten.amin.default,
    aten.var.correction,
    aten.std.correction,
    aten.prod.dim_int,
    aten.max.dim,
    aten.min.dim,
    aten.var_mean.correction,
    aten.std_mean.correction,
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
_SORTS = {aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable}
_CUMULATIVE = {aten.cumsum.default, aten.cumprod.default, aten.cummax.default, aten.cummin.default}
_SYM_OPS = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.mod,
    operator.neg,
    torch.sym_int,
    torch.sym_max,
    torch.sym_min,
    aten.sym_size.int,
    aten.sym_numel.default,
}
# positions may reach these (they index rows by them, or keep them positions)
_TAKES_POSITIONS = {
    *_KEEPS_POSITIONS,
    *VIEW_RULES,
    *SLICE_RULES,
    aten.index.Tensor,
    aten.index_select.default,
    aten.gather.default,
    aten.index_add.default,
    aten.scatter_add.default,
    aten.index_put.default,
}

_RULES: dict[Any, Rule] = {
    **{op: unary for op in _SAME},
    **{op: reduction for op in _REDUCTIONS},
    **{op: along for op in _ALONG},
    **{op: sortlike for op in (*_SORTS, aten.topk.default)},
    **{op: cumulative for op in _CUMULATIVE},
    **{op: factory for op in _FACTORIES},
    **VIEW_RULES,
    **SLICE_RULES,
    **GATHER_RULES,
}


def label_nodes(
    graph: torch.fx.Graph,
    sources: Mapping[torch.fx.Node, Label],
    tokens: Any,
    factory_rows: bool = True,
) -> dict[torch.fx.Node, Label]:
    """Every node's label, from the placeholders' (``sources``; others: None) forward through
    the rule table; ``tokens``: the token count (an int, or the graph's SymInt);
    ``factory_rows``: a static graph's factories of a multiple of the count rows are rows."""
    labels: dict[torch.fx.Node, Label] = {}
    ctx = Context(labels, tokens, factory_rows)
    for node in graph.nodes:
        if node.op == "placeholder":
            labels[node] = sources.get(node)
        elif node.op == "call_function":
            labels[node] = _named(_label(node, ctx), node)
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


def _label(node: torch.fx.Node, ctx: Context) -> Label:
    target = node.target
    if target is operator.getitem:
        source = ctx.of(node.args[0])
        if isinstance(source, tuple):
            return source[int(node.args[1])]  # type: ignore[arg-type]
        return source
    ins = [ctx.of(n) for n in node.all_input_nodes]
    stops = [lab for lab in ins if isinstance(lab, Stop)]
    if stops:
        return stops[0]
    if target in _SYM_OPS:
        return SCALAR
    if target in _FACTORIES:
        return factory(node, bound_arguments(node), ctx)
    if all(lab is None or lab == SCALAR for lab in ins):
        return None  # sizes are values here: each micro-batch uses the whole batch's
    found = effects(node)
    stop = _effect_stop(found)
    if stop is not None:
        return stop
    if found.allocates:  # ``empty_like``, ``new_empty``: a buffer of as many rows, to fill
        lab = ctx.of(node.args[0]) if node.args else None
        return (
            dataclasses.replace(lab, fresh=True)
            if isinstance(lab, Rows)
            else Mixed("a buffer laid out as values that are not rows")
        )
    mixed = next((lab for lab in ins if isinstance(lab, Mixed)), None)
    if mixed is not None:
        return mixed
    if any(isinstance(lab, Positions) for lab in ins) and not _keeps_positions(node):
        return Mixed("positions within the micro-batch used as values")
    rule = _RULES.get(target) or COLLECTIVE_RULES.get(collective_op_name(target) or "")
    if rule is None and isinstance(target, OpOverload) and torch.Tag.pointwise in target.tags:
        rule = pointwise
    if rule is None:
        return Mixed(f"no token rule for {target}")
    return rule(node, bound_arguments(node), ctx)


def _keeps_positions(node: torch.fx.Node) -> bool:
    """Whether ``node`` may take positions: it indexes rows by them, or keeps their values (a
    cast keeps them only to a wide enough integer type)."""
    if node.target not in _TAKES_POSITIONS:
        return False
    if node.target is aten._to_copy.default:
        return node.kwargs.get("dtype") in (None, torch.int64, torch.int32)
    return True


def _effect_stop(found: Effects) -> Stop | None:
    """Why an op that depends on the tokens must not run once per micro-batch, if it must not."""
    if found.collective or found.collective_wait:
        return None  # issued in one order on every rank (the rebuild keeps a's before b's)
    if found.host_sync:
        return Stop("its result's shape (or value on the host) depends on the data")
    if found.random:
        return Stop("it draws random numbers (each micro-batch would draw other ones)")
    if found.writes:
        return Stop("it writes into a buffer the micro-batches would share")
    if found.impure:
        return Stop("it has an effect beyond its result (an assertion, a registered effect)")
    if found.shared_state or found.caller_threads:
        return Stop("it keeps state of another library's that both micro-batches would share")
    return None
