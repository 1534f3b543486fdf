"""Cutting a max-autotune segment (``schedule/segments.py``) out of its graph, before
``schedule/fuse.py`` compiles it: the segment as a GraphModule of its own with the outer values
it reads (and the size symbols its code uses) as inputs and the values read after it as
outputs (:func:`segment_module`), and the views with gaps or broadcasts its readers take made
after it instead (:func:`views_after`)."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx

from airstream import torch_internals
from airstream.graph.effects import effects
from airstream.graph.fused import Segment
from airstream.graph.layouts import dense_order
from airstream.graph.nodes import MADE_AFTER_KEY

__all__ = ["SegmentOutput", "segment_module", "views_after"]


@dataclass(frozen=True)
class SegmentOutput:
    """One value a segment returns: ``node`` (a member), or element ``index`` of a member that
    returns a tuple (read outside by ``getitem`` nodes, which then index the fused node)."""

    node: torch.fx.Node
    index: int | None = None


def segment_module(
    gm: torch.fx.GraphModule, segment: Segment
) -> tuple[torch.fx.GraphModule, list[torch.fx.Node], list[SegmentOutput]]:
    """The segment as its own GraphModule returning a tuple of tensors, with the outer nodes it
    reads (its inputs, in order) and what it returns (the values read after it, in order).

    Its inputs are the outer values its members read, in order of first use, then any size
    symbol its values use that no such input gives Inductor (a size read from a tensor input's
    dimension, or a symbolic int input): Inductor reads a symbol only from its inputs, and code
    using one it was not given fails (``name 's11' is not defined``)."""
    members = list(segment.members)
    inside = set(members)
    inputs: list[torch.fx.Node] = []
    for node in members:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in inputs:
                inputs.append(arg)
    inputs += _symbol_inputs(gm, members, inputs)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for index, node in enumerate(inputs):
        placeholder = graph.placeholder(f"in_{index}")
        placeholder.meta["val"] = node.meta.get("val")
        env[node] = placeholder
    for node in members:
        env[node] = graph.node_copy(node, env.__getitem__)
    outputs: list[SegmentOutput] = []
    values: list[torch.fx.Node] = []
    for node in members:
        outside = [user for user in node.users if user not in inside]
        if not outside:
            continue
        if isinstance(node.meta.get("val"), torch.Tensor):
            outputs.append(SegmentOutput(node))
            values.append(env[node])
            continue
        # a tuple (multi-output op) read after the segment: return the elements read
        indices = sorted({_tuple_index(node, user) for user in outside})
        for index in indices:
            element = graph.call_function(operator.getitem, (env[node], index))
            element.meta["val"] = node.meta["val"][index]
            outputs.append(SegmentOutput(node, index))
            values.append(element)
    graph.output(tuple(values))
    return torch.fx.GraphModule(gm, graph, class_name="AirstreamSegment"), inputs, outputs


def _symbol_inputs(
    gm: torch.fx.GraphModule, members: Sequence[torch.fx.Node], inputs: Sequence[torch.fx.Node]
) -> list[torch.fx.Node]:
    """Outer nodes giving each size symbol the members' values use and ``inputs`` do not
    give, defined before the segment (the graph's symbolic int inputs, ``sym_size`` nodes)."""
    values = [n.meta.get("val") for n in [*members, *inputs]]
    missing = torch_internals.unbound_symbols([n.meta.get("val") for n in inputs], values)
    if not missing:
        return []
    # graph inputs first: ready on every stream at the call's start, where another stream's
    # node would cost a sync
    before = list(itertools.takewhile(lambda n: n is not members[0], gm.graph.nodes))
    found: list[torch.fx.Node] = []
    for node in sorted(before, key=lambda n: n.op != "placeholder"):
        if not missing:
            break
        val = node.meta.get("val")
        given = {s for s in missing if torch_internals.binds_symbol(val, s)}
        if given:
            found.append(node)
            missing -= given
    return found


def views_after(gm: torch.fx.GraphModule, segment: Segment) -> int:
    """Make the views with gaps or broadcasts that a segment's readers take of its values after
    it, as aten views of what it returns, instead of returning them from the compiled code;
    return how many were made.

    Returned from compiled code such a view is whatever Inductor makes of it, a compact copy
    where the value it views is not returned too (rotary embedding's halves), so its readers,
    compiled for the gaps, would read another layout. Made after the segment from the base the
    segment returns (a fresh value, or the segment's input), it has exactly the strides eager
    gives it. A dense view stays in the segment: Inductor returns any dense layout asked for
    (the check after the compile says so), and one aten call per view per call is saved. Each
    outside reader of such a member reads a copy of the view chain from its base, placed after
    the segment's last member on its stream; the members stay for the segment's own readers."""
    members = segment.members
    inside = set(members)
    anchor = members[-1]
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in members:
        outside = [user for user in node.users if user not in inside]
        if not outside or not _is_view(node):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or dense_order(val.shape, val.stride()) is not None:
            continue
        chain = [node]  # from the view read outside back to its first non-view ancestor
        while True:
            (base,) = effects(chain[-1]).aliases or (None,)
            if base is None or base not in inside or not _is_view(base):
                break
            chain.append(base)
        for view in reversed(chain):
            if view in copied:  # a view two chains share (split's, for each element read)
                continue
            with gm.graph.inserting_after(anchor):
                copy = gm.graph.node_copy(view, functools.partial(_renamed, copied))
            copy.meta[MADE_AFTER_KEY] = segment.name
            copied[view] = anchor = copy
        for user in outside:
            user.replace_input_with(node, copied[node])
    return len(copied)


def _is_view(node: torch.fx.Node) -> bool:
    """A view, or an element of the views a view op returns (``split``'s, ``unbind``'s)."""
    if node.target is operator.getitem:
        producer = node.args[0]
        return isinstance(producer, torch.fx.Node) and effects(producer).view
    return effects(node).view


def _renamed(copies: dict[torch.fx.Node, torch.fx.Node], node: torch.fx.Node) -> torch.fx.Node:
    return copies.get(node, node)


def _tuple_index(node: torch.fx.Node, user: torch.fx.Node) -> int:
    if user.target is operator.getitem and isinstance(user.args[1], int):
        return user.args[1]
    raise ValueError(
        f"{user.name} reads the whole tuple {node.name} returns; only getitem of a tuple "
        "can follow a segment"
    )
