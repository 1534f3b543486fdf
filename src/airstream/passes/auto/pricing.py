"""The syncs a stream placement costs, as the real planner would add them.

An automatic pass weighs a placement before it makes it. Which cross-stream edges need a wait is
the planner's decision (``schedule/plan.py`` over ``schedule/deps.py``): data edges, and also
mutation, RNG and collective order, less the waits an earlier wait already implies. The pass asks
the planner itself, on the graph with the placement applied to a copy of its stream labels,
instead of charging one sync per cross-stream data edge.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType

import torch.fx

from airstream.graph.streams import StreamAssignment, assign_streams
from airstream.schedule.deps import Requirement, requirements
from airstream.schedule.plan import planned_syncs

__all__ = ["Pricer"]

Node = torch.fx.Node


class Pricer:
    """Prices placements on one graph: its current streams and its ordering requirements (which
    do not depend on the streams) are worked out once, the planner's walk once per placement."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.base = assign_streams(gm)
        self._reqs: dict[Node, list[Requirement]] | None = None

    def waits(self, where: Mapping[Node, int]) -> dict[Node, tuple[Node, ...]]:
        """For each node, the nodes on other streams its stream waits for first, with the nodes
        of ``where`` on its streams (0: main, k: side stream k) and the others where they are.
        Tuple indexing runs with its producer, as in the stream analysis."""
        if not any(where.values()) and not self.base.side_streams:
            return {}  # one stream: nothing to wait for
        if self._reqs is None:
            self._reqs = requirements(self.gm.graph)
        stream_of = dict(self.base.stream_of)
        for node, stream in where.items():
            stream_of[node.name] = None if stream == 0 else f"__priced_{stream}"
        for node in self.gm.graph.nodes:
            if node.op == "call_function" and node.target is operator.getitem:
                producer = node.args[0]
                if isinstance(producer, Node) and producer.name in stream_of:
                    stream_of[node.name] = stream_of[producer.name]
        streams = tuple(dict.fromkeys([None, *self.base.streams, *stream_of.values()]))
        assignment = StreamAssignment(stream_of=MappingProxyType(stream_of), streams=streams)
        found: dict[Node, list[Node]] = defaultdict(list)
        for sync in planned_syncs(self.gm, assignment, self._reqs):
            found[sync.consumer].append(sync.producer)
        return {node: tuple(producers) for node, producers in found.items()}
