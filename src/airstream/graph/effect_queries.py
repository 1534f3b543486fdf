"""What the stages ask of the nodes' effects (:func:`airstream.graph.effects.effects`): may a node
be dropped (dead code elimination) or merged (CSE), does it run as a step, which values an
executor reads for it, the effects of a fused segment seen from outside, and which nodes may share
storage.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.fx

from airstream.graph.effects import Effects, effects, nodes_in
from airstream.ops.library import record, scope_enter, scope_exit, wait, wait_tensor

__all__ = [
    "alias_classes",
    "data_inputs",
    "droppable",
    "is_executed",
    "mergeable",
    "summarize",
]


def droppable(node: torch.fx.Node) -> bool:
    """May ``node`` be erased when nothing uses its result? Not the graph's inputs or output,
    not a submodule call (its effects are its own), not a node with an effect beyond its result
    (random draws included: dropping an unused ``rand`` would shift every later draw)."""
    return node.op not in ("placeholder", "output", "call_module") and effects(node).pure


def mergeable(node: torch.fx.Node) -> bool:
    """May ``node`` be merged with an identical earlier node (CSE)? A pure call whose result is
    a value: not fresh memory (two ``empty`` buffers a custom op writes are two buffers)."""
    if node.op != "call_function":
        return False
    found = effects(node)
    return found.pure and not found.allocates


def is_executed(node: torch.fx.Node) -> bool:
    """True for nodes that run as a step: every call except markers, waits and bare records."""
    if node.op != "call_function" or node.target in (scope_enter, scope_exit, wait):
        return False
    if node.target is record:
        # A token that only feeds waits is an event position, not work.
        return any(user.target is not wait for user in node.users)
    return True


def data_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The values an executor reads to run ``node``: ``wait_tensor``'s dependency and ``wait``'s
    tokens order work but are never read."""
    if node.op == "call_function" and node.target is wait_tensor:
        return nodes_in(node.args[0])
    if node.op == "call_function" and node.target in (wait, scope_enter, scope_exit):
        return []
    return list(node.all_input_nodes)


def summarize(members: Iterable[torch.fx.Node], outputs: Iterable[torch.fx.Node]) -> Effects:
    """The effects of running ``members`` (fusible nodes, in order) as one step returning
    ``outputs``, seen from outside: the outside inputs they write, and the outside inputs an
    output may alias (followed through views and tuple indexing inside), and whether any member
    reads device data back to the host."""
    inside = list(members)
    member_set = set(inside)
    writes: dict[torch.fx.Node, None] = {}
    roots: dict[torch.fx.Node, tuple[torch.fx.Node, ...]] = {}
    host_sync = False
    states: dict[str, None] = {}
    threads = False
    for node in inside:
        found = effects(node)
        host_sync = host_sync or found.host_sync
        states.update(dict.fromkeys(found.shared_state))
        threads = threads or found.caller_threads
        writes.update((w, None) for w in found.writes if w not in member_set)
        reached: dict[torch.fx.Node, None] = {}
        for source in found.aliases:
            if source in member_set:
                reached.update(dict.fromkeys(roots.get(source, ())))
            else:
                reached[source] = None
        roots[node] = tuple(reached)
    aliases: dict[torch.fx.Node, None] = {}
    for out in outputs:
        aliases.update(dict.fromkeys(roots.get(out, ())))
    return Effects(
        writes=tuple(writes),
        aliases=tuple(aliases),
        host_sync=host_sync,
        shared_state=tuple(states),
        caller_threads=threads,
    )


def alias_classes(graph: torch.fx.Graph) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each node's storage class: nodes whose results may share memory (views, in-place results,
    tuple elements) map to the same representative node, the earliest of them."""
    parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(node: torch.fx.Node) -> torch.fx.Node:
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in graph.nodes:
        parent[node] = node
        for source in effects(node).aliases:
            a, b = find(source), find(node)
            if a is not b:
                first, second = (a, b) if order[a] < order[b] else (b, a)
                parent[second] = first
    return {node: find(node) for node in graph.nodes}
