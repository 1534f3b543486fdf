"""The pass toolkit: the few operations stream passes are made of.

    experts = select_nodes(gm, module=r"experts\\.3\\b")
    place_on_stream(gm, experts, "expert_3")
    add_control_edge(gm, router_done, shared_start)
    streams_of(gm).stream(node)        # "expert_3"; None for the main stream
    graph_kind(gm)                     # "inference", "forward" or "backward"

Every helper checks its input and raises ``ValueError`` naming the node and what to do; inside a
pass, the pass manager turns it into a PassError naming the pass. Nodes the helpers add carry no
``meta["val"]``: the pass manager fills it after the pass (or call :func:`fill_meta`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.fx

from airstream.graph.nodes import describe, graph_kind
from airstream.graph.streams import StreamAssignment, assign_streams
from airstream.ops.library import (
    STREAM_LABEL_KEY,
    STREAM_PRIORITY_KEY,
    is_air_op,
    record,
    scope_enter,
    scope_exit,
    wait,
)
from airstream.passes.meta import fill_meta
from airstream.torch_internals import OpOverloadPacket, module_stack

__all__ = [
    "add_control_edge",
    "fill_meta",
    "graph_kind",
    "module_paths",
    "place_on_stream",
    "select_nodes",
    "streams_of",
]


def streams_of(gm: torch.fx.GraphModule) -> StreamAssignment:
    """Every node's stream as the graph stands, however it was set: a pass's or TorchAir's
    ``scope_enter``/``scope_exit``, ``airstream.stream``, a ``torch.Stream`` block in the model
    (named after its variable) or a native annotation a pass wrote. ``.stream(node)`` is one
    node's label (None: the main stream). Raises StreamError for an invalid stream program."""
    return assign_streams(gm)


def module_paths(node: torch.fx.Node) -> list[str]:
    """The module paths a node was traced under, outermost first (``experts.3.up``).

    Forward and inference graphs carry ``nn_module_stack``; backward graphs carry the forward
    node's stack as ``fwd_nn_module_stack``. Dynamo's ``L['self'].`` prefixes are removed."""
    stack = module_stack(node)
    paths = []
    for value in stack.values():
        path = value[0] if isinstance(value, tuple) else str(value)
        paths.append(re.sub(r"^L\['[^']*'\]\.?", "", str(path)))
    return paths


def select_nodes(
    gm: torch.fx.GraphModule,
    *,
    module: str | re.Pattern[str] | None = None,
    target: Any = None,
) -> list[torch.fx.Node]:
    """The ``call_function`` nodes (air ops excluded) matching every given criterion, in order.

    Args:
        module: a regex searched in each of the node's module paths (see :func:`module_paths`).
        target: an op (``torch.ops.aten.mm.default`` or the packet ``torch.ops.aten.mm``), or a
            collection of them.
    """
    if module is None and target is None:
        raise ValueError("select_nodes needs module=... or target=... (or both)")
    regex = re.compile(module) if isinstance(module, str) else module
    targets: set[Any] | None = None
    if target is not None:
        items = target if isinstance(target, (set, frozenset, list, tuple)) else [target]
        targets = set()
        for item in items:
            if isinstance(item, OpOverloadPacket):
                targets |= {getattr(item, name) for name in item.overloads()}
            else:
                targets.add(item)
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or is_air_op(node.target):
            continue
        if targets is not None and node.target not in targets:
            continue
        if regex is not None and not any(regex.search(p) for p in module_paths(node)):
            continue
        out.append(node)
    return out


def _check_owned(gm: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node], helper: str) -> None:
    for node in nodes:
        if not isinstance(node, torch.fx.Node):
            raise ValueError(f"{helper}: expected FX nodes, got {type(node).__name__} {node!r}")
        if node.graph is not gm.graph:
            raise ValueError(
                f"{helper}: {describe(node)} belongs to another graph; select nodes from the "
                "graph module the pass received"
            )


def place_on_stream(
    gm: torch.fx.GraphModule,
    nodes: Sequence[torch.fx.Node],
    label: str,
    *,
    priority: int | None = None,
) -> int:
    """Run ``nodes`` on stream ``label`` with the fewest ``scope_enter``/``scope_exit`` pairs.

    Each maximal run of consecutive selected nodes gets one pair (markers already between them
    do not break a run). Nothing moves, so the graph stays valid. Returns the pairs inserted.
    """
    if not isinstance(label, str) or not label:
        raise ValueError(f"place_on_stream: label must be a non-empty str, got {label!r}")
    _check_owned(gm, nodes, "place_on_stream")
    for node in nodes:
        if node.op != "call_function" or is_air_op(node.target):
            raise ValueError(
                f"place_on_stream: {describe(node)} is not an op that runs; pass call_function "
                "nodes (placeholders, outputs and air markers have no stream)"
            )
    chosen = set(nodes)
    keys, values = [STREAM_LABEL_KEY], [label]
    if priority is not None:
        keys, values = [*keys, STREAM_PRIORITY_KEY], [*values, str(priority)]
    runs: list[list[torch.fx.Node]] = []
    current: list[torch.fx.Node] = []
    for node in gm.graph.nodes:
        if node in chosen:
            current.append(node)
        elif node.op == "call_function" and node.target in (scope_enter, scope_exit):
            if current:  # a marker inside the run would change scope nesting: close the run
                runs.append(current)
                current = []
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    graph = gm.graph
    for run in runs:
        with graph.inserting_before(run[0]):
            graph.call_function(scope_enter, (list(keys), list(values)))
        with graph.inserting_after(run[-1]):
            graph.call_function(scope_exit, ())
    return len(runs)


def _reaches(start: torch.fx.Node, goal: torch.fx.Node) -> bool:
    """True if ``goal`` depends on ``start`` through data edges."""
    seen = {start}
    frontier = [start]
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user is goal:
                return True
            if user not in seen:
                seen.add(user)
                frontier.append(user)
    return False


def add_control_edge(
    gm: torch.fx.GraphModule, before: torch.fx.Node, after: torch.fx.Node
) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Make ``after`` start only once ``before`` has finished: a ``record`` right after
    ``before`` (on its stream) and a ``wait`` on it right before ``after`` (on its stream).

    Returns the (record, wait) nodes. Raises ValueError if ``after`` comes first in graph order
    (the edge would need a reordering) or if ``before`` depends on ``after`` (a cycle)."""
    _check_owned(gm, (before, after), "add_control_edge")
    if before is after:
        raise ValueError(f"add_control_edge: {describe(before)} cannot wait for itself")
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    if _reaches(after, before):
        raise ValueError(
            f"add_control_edge: {describe(before)} depends on {describe(after)}, so making the "
            "second wait for the first would create a cycle"
        )
    if order[after] < order[before]:
        raise ValueError(
            f"add_control_edge: {describe(after)} comes before {describe(before)} in the graph; "
            "a control edge must point forward in graph order (move the nodes first)"
        )
    graph = gm.graph
    with graph.inserting_after(before):
        token = graph.call_function(record, ())
    with graph.inserting_before(after):
        waited = graph.call_function(wait, ([token],))
    return token, waited
