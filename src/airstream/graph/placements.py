"""Copies of a lowered graph (:mod:`airstream.graph.streams`): as placed, or with its calls placed
anew: on one stream, or on the streams a function gives each node. What measuring compares a
placement with (:mod:`airstream.compiler.measuring`: one stream, auto_streams' alternatives, the
placement with other thread counts)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch.fx

from airstream.graph.streams import STREAM_KEY
from airstream.ops.library import air_op_for, record, scope_enter, scope_exit, wait, wait_tensor

__all__ = ["as_placed", "on_one_stream", "on_streams"]

_STREAM_STEPS = (scope_enter, scope_exit, record, wait, wait_tensor)


def as_placed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of a graph as it stands, sharing its parameters and node values: one a compile
    may fuse without changing ``gm``."""
    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # node meta copied, values shared
    out.meta.update(gm.meta)
    return out


def on_one_stream(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of a lowered graph with every call on the main stream (:func:`on_streams`)."""
    return on_streams(gm, lambda node: None)


def on_streams(
    gm: torch.fx.GraphModule, label_of: Callable[[torch.fx.Node], str | None]
) -> torch.fx.GraphModule:
    """A copy of a lowered graph, sharing its parameters and node values, with each call on the
    stream ``label_of`` gives it (None: main) and without the scope markers, records and waits
    (``wait_tensor(x, dep)`` is ``x``): the planner adds the syncs the new placement needs. On
    one stream, the same program as one stream runs it, where markers would order nothing and
    cut its max-autotune segments short."""
    out = as_placed(gm)
    graph = out.graph
    for node in reversed(graph.nodes):  # users before what they use
        op = node.target if node.target in _STREAM_STEPS else air_op_for(node.target)
        if node.op == "call_function" and op in _STREAM_STEPS:
            if op is wait_tensor:
                node.replace_all_uses_with(node.args[0])
            if not node.users:
                graph.erase_node(node)
                continue
        if STREAM_KEY in node.meta:
            node.meta[STREAM_KEY] = label_of(node)
    graph.lint()
    out.recompile()
    return out
