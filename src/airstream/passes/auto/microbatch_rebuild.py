"""The graph :func:`airstream.passes.auto.microbatch.microbatch_overlap` makes: shared ops, then
each region op copied per micro-batch stage by stage (a0, b0, a1, b1, ...), then the merged
rest. In a copy, a size of the token dimension follows the micro-batch's count (a ``view``'s or
a factory's, an ``arange``'s end, an ``all_to_all_single``'s splits) and every other use of the
count is a value and stays the whole batch's; a squeeze removes only what it removed before."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.layouts import dense_order
from airstream.graph.nodes import describe
from airstream.passes.auto.microbatch_region import (
    Refused,
    Region,
    Tokens,
    feeding_collectives,
    mergeable,
    merged_part,
    returned_views,
    stages,
)
from airstream.passes.auto.token_labels import Label, Positions, Rows
from airstream.passes.auto.token_rules import rows_of_size, shape, squeezed
from airstream.torch_internals import collective_op_name, multiple_of, op_schema

__all__ = ["Rebuilt", "rebuild"]

aten = torch.ops.aten

_SIZE_LISTS: dict[Any, str] = {  # op -> its argument holding a size per output dimension
    aten.view.default: "size",
    aten._unsafe_view.default: "size",
    aten.reshape.default: "size",
    aten.expand.default: "size",
    aten.full.default: "size",
    aten.zeros.default: "size",
    aten.ones.default: "size",
    aten.empty.memory_format: "size",
    aten.new_zeros.default: "size",
    aten.new_empty.default: "size",
    aten.new_ones.default: "size",
    aten.new_full.default: "size",
}
_SQUEEZES = {aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims}


@dataclass
class Rebuilt:
    """The split graph (not yet the module's), where its micro-batches merge (the original
    graph's first op that runs on the merged batch; None: the output), its collectives
    and waits (for the communication stream), and each copy's original and micro-batch."""

    graph: torch.fx.Graph
    merged_at: torch.fx.Node | None
    comm: list[torch.fx.Node] = field(default_factory=list)
    copies: dict[torch.fx.Node, tuple[torch.fx.Node, int]] = field(default_factory=dict)
    counts: tuple[Any, Any] = (0, 0)
    whole: dict[torch.fx.Node, torch.fx.Node] = field(default_factory=dict)  # copies of the
    # graph's own ops on the whole batch (shared and merged), to their originals


def rebuild(gm: torch.fx.GraphModule, tokens: Tokens, region: Region) -> Rebuilt:
    """``gm``'s graph rewritten into a new graph: shared ops, then the micro-batches stage by
    stage, then the merged rest (``gm`` itself is left as it was)."""
    old, labels, nodes = gm.graph, region.labels, region.nodes
    new = torch.fx.Graph(owning_module=gm)
    full: dict[torch.fx.Node, torch.fx.Node] = {}
    dependent = merged_part(old, nodes)
    for node in old.nodes:
        if node.op == "placeholder":
            full[node] = _copy(new, node, lambda a: full[a])
    counts = _counts(new, tokens, full)
    micro = _Micro(new, tokens, labels, full, counts)
    merged: dict[torch.fx.Node, torch.fx.Node] = {}

    def in_full(node: torch.fx.Node) -> torch.fx.Node:
        if node not in nodes:
            return full[node]
        if node not in merged:
            merged[node] = _merge(new, node, labels[node], micro, counts)  # type: ignore[arg-type]
        return merged[node]

    # shared ops that need no token (weights transposed, sizes): before the micro-batches
    for node in old.nodes:
        if node.op in ("call_function", "get_attr") and node not in nodes | dependent:
            full[node] = _copy(new, node, in_full)
    out = Rebuilt(new, None, counts=counts)
    stage = stages(old, nodes)
    order = {node: k for k, node in enumerate(old.nodes)}
    feeds = feeding_collectives(old, nodes, stage)
    for s in range(max(stage.values(), default=-1) + 1):
        block = [n for n in old.nodes if stage.get(n) == s]
        block.sort(key=lambda n: (n not in feeds, order[n]))  # issue the collective early
        for i in (0, 1):
            for node in block:
                made = micro.copy(node, i)
                out.copies[made] = (node, i)
                if effects(node).collective or effects(node).collective_wait:
                    out.comm.append(made)
    views = returned_views(old)
    remade: dict[torch.fx.Node, torch.fx.Node] = {}

    def in_output(node: torch.fx.Node) -> torch.fx.Node:
        """A returned value: a view stays a view of its base's memory (AOTAutograd rebuilds
        it from there), made anew from the merged batch."""
        if node not in views or node not in nodes:
            return in_full(node)
        if node not in remade:
            remade[node] = _copy(new, node, in_output, f"{node.name}_whole")
        return remade[node]

    for node in old.nodes:
        if node in dependent or node.op == "output":
            full[node] = _copy(new, node, in_output if node.op == "output" else in_full)
            if out.merged_at is None and node.op == "call_function":
                out.merged_at = node
    out.whole = {made: node for node, made in full.items()}
    return out


def _copy(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    env: Callable[[torch.fx.Node], Any],
    name: str | None = None,
) -> torch.fx.Node:
    args = torch.fx.map_arg(node.args, env)
    kwargs = torch.fx.map_arg(node.kwargs, env)
    out = graph.create_node(node.op, node.target, args, kwargs, name or node.name, node.type)
    out.meta = dict(node.meta)
    return out


def _counts(
    graph: torch.fx.Graph, tokens: Tokens, full: dict[torch.fx.Node, torch.fx.Node]
) -> tuple[Any, Any]:
    """The micro-batches' token counts: ``T // 2`` and the rest (nodes, in a dynamic graph)."""
    if tokens.node is None:
        return (tokens.count // 2, tokens.count - tokens.count // 2)
    half = graph.create_node(
        "call_function", operator.floordiv, (full[tokens.node], 2), {}, "tokens_mb0"
    )
    rest = graph.create_node(
        "call_function", operator.sub, (full[tokens.node], half), {}, "tokens_mb1"
    )
    return (half, rest)


def _scaled(graph: torch.fx.Graph, count: Any, per: int) -> Any:
    if per == 1:
        return count
    if isinstance(count, int):
        return count * per
    return graph.call_function(operator.mul, (count, per))


class _Micro:
    """The micro-batches' copies of the region's ops and of the sizes they follow."""

    def __init__(
        self,
        graph: torch.fx.Graph,
        tokens: Tokens,
        labels: dict[torch.fx.Node, Label],
        full: dict[torch.fx.Node, torch.fx.Node],
        counts: tuple[Any, Any],
    ) -> None:
        self.graph, self.tokens, self.labels, self.full = graph, tokens, labels, full
        self.counts = counts
        self.env: tuple[dict[torch.fx.Node, Any], dict[torch.fx.Node, Any]] = ({}, {})
        self.sizes: tuple[dict[torch.fx.Node, Any], dict[torch.fx.Node, Any]] = ({}, {})

    def value(self, node: torch.fx.Node, i: int) -> Any:
        """``node`` as micro-batch ``i`` reads it as a tensor or a value: its copy, its slice
        of an input, or the whole batch's (a shared value, a size used as a value)."""
        env = self.env[i]
        if node in env:
            return env[node]
        lab = self.labels.get(node)
        if node.op == "placeholder" and isinstance(lab, Rows):
            env[node] = self._slice(node, lab, i)
            return env[node]
        return self.full[node]

    def size(self, node: torch.fx.Node, i: int) -> Any:
        """A size of the token dimension derived from the count (the count's placeholder, or an
        expression of it such as ``s0 * 2`` or ``sym_size(x, 0)``), as micro-batch ``i``'s: its
        multiple of the micro-batch's count, made from that count (an expression is not copied:
        one reading another dimension that equals the count would keep the whole batch's)."""
        sizes = self.sizes[i]
        if node in sizes:
            return sizes[node]
        if node is self.tokens.node:
            sizes[node] = self.counts[i]
            return sizes[node]
        per = multiple_of(node.meta.get("val"), self.tokens.count)
        if per is None:
            raise Refused(
                f"{describe(node)} is a size of the token dimension derived from the count "
                f"{self.tokens.count} other than as a multiple of it"
            )
        sizes[node] = _scaled(self.graph, self.counts[i], per)
        return sizes[node]

    def _slice(self, node: torch.fx.Node, lab: Rows, i: int) -> torch.fx.Node:
        """Micro-batch ``i``'s rows of an input, laid out in memory as the whole input is (a
        slice of an inner dimension is copied dense, so its views view as the whole's did)."""
        cut = _scaled(self.graph, self.counts[0], lab.per)  # a's rows end where b's start
        bounds = (0, cut) if i == 0 else (cut, None)
        part = self.graph.create_node(
            "call_function",
            aten.slice.Tensor,
            (self.full[node], lab.dim, *bounds),
            {},
            f"{node.name}_mb{i}",
        )
        val = node.meta.get("val")
        order = dense_order(val.shape, val.stride()) if isinstance(val, torch.Tensor) else None
        if order is not None and order.index(lab.dim) != 0:
            moved = self.graph.call_function(aten.permute.default, (part, order))
            dense = self.graph.call_function(aten.clone.default, (moved,))
            dense.kwargs = {"memory_format": torch.contiguous_format}
            back = [order.index(d) for d in range(len(order))]
            part = self.graph.call_function(aten.permute.default, (dense, back))
        return part

    def copy(self, node: torch.fx.Node, i: int) -> torch.fx.Node:
        """Micro-batch ``i``'s copy of region op ``node``."""
        args, kwargs = self._arguments(node, i)
        target = node.target
        if target in _SQUEEZES:
            target, args, kwargs = aten.squeeze.dims, (args[0], squeezed(node)), {}
        made = self.graph.create_node("call_function", target, args, kwargs, f"{node.name}_mb{i}")
        made.meta = {k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")}
        self.env[i][node] = made
        return made

    def _arguments(self, node: torch.fx.Node, i: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        value = functools.partial(self.value, i=i)
        schema = op_schema(node.target)
        if schema is None:
            return torch.fx.map_arg(node.args, value), torch.fx.map_arg(node.kwargs, value)
        names = [a.name for a in schema.arguments]
        args = tuple(self._argument(node, names[k], v, i) for k, v in enumerate(node.args))
        kwargs = {k: self._argument(node, k, v, i) for k, v in node.kwargs.items()}
        return args, kwargs

    def _argument(self, node: torch.fx.Node, name: str, arg: Any, i: int) -> Any:
        """One argument of a copy: sizes of the token dimension follow micro-batch ``i``."""
        target, value = node.target, functools.partial(self.value, i=i)
        if collective_op_name(target) == "all_to_all_single" and name.endswith("split_sizes"):
            return [self._split(node, s, i) for s in arg]
        follows = _SIZE_LISTS.get(target) == name and isinstance(arg, (list, tuple))
        if follows:
            return [self._entry(node, d, s, i) for d, s in enumerate(arg)]
        if target in (aten.arange.default, aten.arange.start) and name == "end":
            return self._entry(node, 0, arg, i)
        return torch.fx.map_arg(arg, value)

    def _follows(self, node: torch.fx.Node, dim: int) -> bool:
        """Whether dimension ``dim`` of ``node``'s value holds the micro-batch's rows (the
        region holds rows and positions only: a mixed value never joins back, so it leaves)."""
        lab = self.labels.get(node)
        if isinstance(lab, Rows):
            return lab.dim == dim
        return isinstance(lab, Positions) and dim == 0

    def _entry(self, node: torch.fx.Node, dim: int, size: Any, i: int) -> Any:
        if not self._follows(node, dim):
            return torch.fx.map_arg(size, functools.partial(self.value, i=i))
        if isinstance(size, torch.fx.Node):
            return self.size(size, i)
        out = shape(node)
        if isinstance(size, int) and size >= 0 and isinstance(self.tokens.count, int) and out:
            per = rows_of_size(out[dim], self.tokens.count)
            if per is not None:
                return per * self.counts[i]
        return size

    def _split(self, node: torch.fx.Node, split: Any, i: int) -> Any:
        """An ``all_to_all_single`` split size, as micro-batch ``i``'s."""
        tokens, count = self.tokens.count, self.counts[i]
        if isinstance(split, torch.fx.Node):
            return self.size(split, i)
        if isinstance(tokens, int) and split * count % tokens == 0:
            return split * count // tokens
        if split == 0:
            return 0
        raise Refused(
            f"{describe(node)}: split size {split} does not follow the token count "
            f"{tokens}; compute the split sizes from the tokens (or compile with dynamic=True)"
        )


def _merge(
    graph: torch.fx.Graph, node: torch.fx.Node, lab: Rows, micro: _Micro, counts: tuple[Any, Any]
) -> torch.fx.Node:
    """The micro-batches' values of ``node`` joined into the whole batch's."""
    assert mergeable(node, lab)
    parts = [micro.env[0][node], micro.env[1][node]]
    if lab.blocks == 1:
        return _cat_like(graph, node, parts, lab.dim)
    # blocks of rows (one per rank): the micro-batches' rows joined block by block; sizes
    # spelt out, so a micro-batch of no token joins too
    size = list(node.meta["val"].shape)
    views = []
    for part, count in zip(parts, counts, strict=True):
        rows = _scaled(graph, count, lab.per)
        blocked = [*size[: lab.dim], lab.blocks, rows, *size[lab.dim + 1 :]]
        views.append(graph.call_function(aten.view.default, (part, blocked)))
    joined = graph.call_function(aten.cat.default, (views, lab.dim + 1))
    total: Any = size[lab.dim]
    if micro.tokens.node is not None:
        total = _scaled(graph, micro.full[micro.tokens.node], lab.per * lab.blocks)
    flat = [*size[: lab.dim], total, *size[lab.dim + 1 :]]
    return graph.call_function(aten.view.default, (joined, flat))


def _cat_like(
    graph: torch.fx.Graph, node: torch.fx.Node, parts: list[torch.fx.Node], dim: int
) -> torch.fx.Node:
    """``cat(parts, dim)`` laid out in memory as ``node``'s value was (a transposed value saved
    for the backward keeps its strides: the backward was compiled for them)."""
    val = node.meta.get("val")
    order = dense_order(val.shape, val.stride()) if isinstance(val, torch.Tensor) else None
    if order is None or order == list(range(len(order))):
        return graph.call_function(aten.cat.default, (parts, dim))
    moved = [graph.call_function(aten.permute.default, (p, order)) for p in parts]
    joined = graph.call_function(aten.cat.default, (moved, order.index(dim)))
    back = [order.index(i) for i in range(len(order))]
    return graph.call_function(aten.permute.default, (joined, back))
