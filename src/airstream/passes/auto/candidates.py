"""The placements ``auto_streams`` proposes beside the one it applies, for
``stream_config.measure_placement`` to time against it and one stream.

The cost table orders placements; it cannot rank close ones reliably (a list schedule that
interleaves eight experts over two streams is predicted faster than each expert kept whole on one
stream, and on a 2-core VM measures 1.32x of one stream against 1.47x). So besides the placement
it applies, ``auto_streams`` keeps up to :data:`MAX_ALTERNATIVES` others whose predicted time is
no worse than one stream's: the structural roles, the list schedule, and **balanced branches**:
each group of parallel branches (``patterns.parallel_projections``: experts reading one
activation, Q/K/V, gate and up) split whole over ``max_streams`` streams, longest branch first to
the least loaded stream (LPT), which is what ``moe_experts`` does by module name.

An alternative is written into each node's meta (``nodes.CANDIDATES_KEY``: name -> stream label,
no entry: main), which survives the passes after it as every key does (a node a pass makes in
place of another copies its meta), and the names into the graph's meta (``nodes.NAMES_KEY``), in
predicted order. :func:`airstream.streams.on_streams` builds each as a graph of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.fx

from airstream.calibration import MachineCosts
from airstream.nodes import CANDIDATES_KEY, NAMES_KEY
from airstream.passes.auto.pricing import Pricer
from airstream.passes.auto.roles import Role
from airstream.passes.auto.simulate import makespan

__all__ = [
    "MAX_ALTERNATIVES",
    "Candidate",
    "balanced_branches",
    "record_alternatives",
]

Node = torch.fx.Node

MAX_ALTERNATIVES = 2  # each costs a compile and its share of the measured first calls


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
        for branch in sorted(role.options, key=lambda b: -sum(cost.get(n, 0.0) for n in b)):
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


def record_alternatives(
    gm: torch.fx.GraphModule, single: float, alternatives: Sequence[Candidate]
) -> list[str]:
    """Write the alternatives no slower than one stream by prediction (the fastest
    :data:`MAX_ALTERNATIVES`) into the graph; their names, in predicted order."""
    kept = sorted((c for c in alternatives if c.predicted <= single), key=lambda c: c.predicted)
    kept = kept[:MAX_ALTERNATIVES]
    for node in gm.graph.nodes:
        node.meta.pop(CANDIDATES_KEY, None)
    for candidate in kept:
        for node, index in candidate.where.items():
            if index != 0:
                node.meta.setdefault(CANDIDATES_KEY, {})[candidate.name] = candidate.labels[index]
    names = [c.name for c in kept]
    gm.meta[NAMES_KEY] = names
    return names
