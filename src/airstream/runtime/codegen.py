"""Shared pieces of the executors' FX code generation."""

from __future__ import annotations

from collections.abc import Callable

import torch.fx

from airstream.runtime.trace import op_begin, op_end

__all__ = ["emit_op"]


def emit_op(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    arg: Callable[[torch.fx.Node], torch.fx.Node],
    trace: torch.fx.Node | None,
) -> torch.fx.Node:
    """Copy ``node`` into ``graph`` (inputs mapped by ``arg``), bracketed by tracing calls when
    ``trace`` (the generated function's StreamTrace placeholder) is given."""
    if trace is None:
        return graph.node_copy(node, arg)
    token = graph.call_function(op_begin, (trace, node.name))
    new = graph.node_copy(node, arg)
    segment = node.meta.get("air_segment")
    if segment is None:
        graph.call_function(op_end, (trace, node.name, token))
    else:  # max-autotune: the profile says what the segment fused and which kernels ran
        details = (segment.describe(), segment.segment.nodes)
        graph.call_function(op_end, (trace, node.name, token, *details))
    return new
