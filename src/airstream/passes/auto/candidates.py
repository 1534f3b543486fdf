"""The placements ``auto_streams`` proposes beside the one it applies, for
``stream_config.measure_placement`` to time against it and one stream.

The cost table orders placements; it cannot rank close ones reliably (a list schedule that
interleaves eight experts over two streams is predicted faster than each expert kept whole on one
stream, and on a 2-core VM measures 1.32x of one stream against 1.47x). So besides the placement
it applies, ``auto_streams`` keeps up to ``alternatives`` others (default 1: each costs a compile
and its share of the measured first calls) whose predicted time is no worse than one stream's,
the best predicted first, from: the structural roles, the list schedule, and **balanced branches**:
each group of parallel branches (``patterns.parallel_projections``: experts reading one
activation, Q/K/V, gate and up) split whole over ``max_streams`` streams, longest branch first to
the least loaded stream (LPT), which is what ``moe_experts`` does by module name.

An alternative is written into each node's meta (``nodes.CANDIDATES_KEY``: name -> stream label,
no entry: main), which survives the passes after it as every key does (a node a pass makes in
place of another copies its meta), and the names into the graph's meta (``nodes.NAMES_KEY``), in
predicted order. :func:`airstream.graph.placements.on_streams` builds each as a graph of its own.

The list schedule reorders the graph by predicted start. The other placements were made for
the graph's own order: interleaved by the list schedule, a stream reaches the sum of two
branches before its own branch and waits. So where the list schedule applied, each node keeps
its place before (:data:`ORDER_KEY`) and :func:`in_original_order` puts an alternative's graph
back in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from airstream.graph.devices import graph_device
from airstream.graph.effects import effects
from airstream.graph.nodes import CANDIDATES_KEY, NAMES_KEY
from airstream.machine.calibration import MachineCosts
from airstream.passes.auto.pricing import Pricer
from airstream.passes.auto.roles import Role
from airstream.passes.auto.simulate import makespan, ordered_by

__all__ = [
    "LIST_SCHEDULE",
    "ORDER_KEY",
    "SHARED_EXPERTS",
    "Candidate",
    "balanced_branches",
    "measured_here",
    "shared_experts_beside",
    "in_original_order",
    "with_private_inputs",
    "record_alternatives",
]

Node = torch.fx.Node

LIST_SCHEDULE = "list schedule"
SHARED_EXPERTS = "shared experts"
ORDER_KEY = "air_auto_order"  # node.meta: its place before the list schedule reordered the graph


@dataclass(frozen=True)
class Candidate:
    """A placement: each node's stream index (0: main), each index's label, its predicted
    time."""

    name: str
    where: dict[Node, int]
    labels: dict[int, str]
    predicted: float


def balanced_branches(
    calls: Sequence[Node],
    cost: dict[Node, float],
    roles: Sequence[Role],
    figures: MachineCosts,
    max_streams: int,
    max_tokens: int,
    pricer: Pricer,
) -> Candidate | None:
    """Each projection group's branches, whole, over ``max_streams`` streams by LPT; None where
    no group has two branches within ``max_tokens``."""
    where: dict[Node, int] = {}
    for role in roles:
        if role.kind != "proj" or role.tokens > max_tokens or len(role.options) < 2:
            continue
        load = [0.0] * max_streams
        branches = [with_private_inputs(b) for b in role.options]
        for branch in sorted(branches, key=lambda b: -sum(cost.get(n, 0.0) for n in b)):
            stream = min(range(max_streams), key=load.__getitem__)
            load[stream] += sum(cost.get(n, 0.0) for n in branch)
            where.update(dict.fromkeys(branch, stream))
    used = {s for s in where.values() if s != 0}
    if not used:
        return None
    moved = {n: s for n, s in where.items() if s != 0}
    predicted = makespan(calls, cost, moved, figures, pricer.waits(moved))
    predicted += figures.side_stream_seconds * len(used)
    labels = {s: f"auto_branch_{s}" for s in used}
    return Candidate("balanced branches", moved, labels, predicted)


def measured_here(gm: torch.fx.GraphModule, config: Any) -> bool:
    """Whether ``stream_config.measure_placement`` can measure this graph once placed: it is
    not off, and the graph is a CPU graph (inference, or a training step's forward or backward)
    run by streams (no debug executor). A graph saved in a compile cache is measured too: its
    load finishes it as a compile does.
    ``config`` None or without the options (a pass called by hand): no."""
    options = getattr(config, "stream_config", None)
    debug = getattr(config, "debug", None)
    if options is None or debug is None or options.measure_placement is False:
        return False
    return not debug.run_eagerly and debug.data_dump.type is None and graph_device(gm).type == "cpu"


def shared_experts_beside(
    calls: Sequence[Node],
    cost: dict[Node, float],
    roles: Sequence[Role],
    figures: MachineCosts,
    max_tokens: int,
    pricer: Pricer,
) -> Candidate | None:
    """Every shared expert (within ``max_tokens``) on one side stream, with the ops only it
    reads: what serving stacks place by hand, proposed whole even where the cost table
    prices each one alone at no gain."""
    where: dict[Node, int] = {}
    for role in roles:
        if role.kind == "shared" and role.tokens <= max_tokens:
            where.update(dict.fromkeys(with_private_inputs(role.options[0]), 1))
    if not where:
        return None
    predicted = makespan(calls, cost, where, figures, pricer.waits(where))
    return Candidate(
        "shared experts", where, {1: "auto_shared"}, predicted + figures.side_stream_seconds
    )


def with_private_inputs(branch: Sequence[Node]) -> set[Node]:
    """``branch`` and the ops only it reads (a weight's transpose, a view), so that moving the
    branch moves them too: left behind, each is a sync, and one the main stream reaches only
    after the work before it in graph order."""
    nodes = set(branch)
    stack = list(branch)
    while stack:
        for source in stack.pop().all_input_nodes:
            if source.op != "call_function" or source in nodes or effects(source).ordered:
                continue
            if all(user in nodes for user in source.users):
                nodes.add(source)
                stack.append(source)
    return nodes


def record_alternatives(
    gm: torch.fx.GraphModule, single: float, alternatives: Sequence[Candidate], most: int
) -> list[str]:
    """Write the alternatives no slower than one stream by prediction (the fastest ``most``)
    into the graph; their names, in predicted order."""
    kept = sorted((c for c in alternatives if c.predicted <= single), key=lambda c: c.predicted)
    kept = kept[:most]
    for node in gm.graph.nodes:
        node.meta.pop(CANDIDATES_KEY, None)
    for candidate in kept:
        for node, index in candidate.where.items():
            if index != 0:
                node.meta.setdefault(CANDIDATES_KEY, {})[candidate.name] = candidate.labels[index]
    names = [c.name for c in kept]
    gm.meta[NAMES_KEY] = names
    return names


def in_original_order(gm: torch.fx.GraphModule) -> bool:
    """Put a graph the list schedule reordered back in its order before (each node's
    :data:`ORDER_KEY`; a node made later goes right after its latest input), as far as its
    inputs allow; whether it moved anything. Left as it is where any op's order carries meaning
    (a write, an RNG op): only data dependencies are kept here."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr")]
    if not any(ORDER_KEY in n.meta for n in nodes):
        return False
    if any(n.op == "call_function" and effects(n).ordered for n in nodes):
        return False
    key: dict[Node, float] = {}
    for node in nodes:  # graph order: every input's key is known
        stamped = node.meta.get(ORDER_KEY)
        inherited = max((key[i] for i in node.all_input_nodes if i in key), default=-1.0)
        key[node] = float(stamped) if stamped is not None else inherited
    ordered = ordered_by(nodes, key.__getitem__)  # ties: the graph's present order
    anchor = nodes[0].prev
    for node in ordered:
        anchor.append(node)
        anchor = node
    gm.graph.lint()
    gm.recompile()
    return ordered != nodes
