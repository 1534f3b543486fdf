"""Regions: the stretches of a graph between consecutive air ops.

Built-in passes must not move a node across an air op, so they only merge or rewrite nodes within
one region. :func:`air_layout` is the invariant the pass manager checks around every built-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx

from airstream.ops.library import is_air_op

__all__ = ["AirLayout", "air_layout", "region_index"]


def _is_air(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_air_op(node.target)


def region_index(graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
    """Map each node to its region: air ops get a region of their own."""
    regions: dict[torch.fx.Node, int] = {}
    index = 0
    for node in graph.nodes:
        if _is_air(node):
            regions[node] = index + 1
            index += 2
        else:
            regions[node] = index
    return regions


@dataclass(frozen=True)
class AirLayout:
    """The air ops in graph order, and for every other node the air op just before it."""

    air_ops: tuple[str, ...]
    preceding_air_op: dict[str, str | None]

    def moved_since(self, before: AirLayout) -> str | None:
        """Describe how this layout breaks ``before``'s air ops or regions, or None if intact."""
        if self.air_ops != before.air_ops:
            lost = [n for n in before.air_ops if n not in self.air_ops]
            added = [n for n in self.air_ops if n not in before.air_ops]
            if lost or added:
                return f"air ops removed {lost} / added {added}"
            return f"air ops reordered: {list(before.air_ops)} -> {list(self.air_ops)}"
        for name, prev in self.preceding_air_op.items():
            if name in before.preceding_air_op and before.preceding_air_op[name] != prev:
                return (
                    f"node {name!r} moved across an air op (it followed "
                    f"{before.preceding_air_op[name]!r}, now follows {prev!r})"
                )
        return None


def air_layout(graph: torch.fx.Graph) -> AirLayout:
    """Snapshot the air-op layout of ``graph``."""
    air: list[str] = []
    preceding: dict[str, str | None] = {}
    last: str | None = None
    for node in graph.nodes:
        if _is_air(node):
            air.append(node.name)
            last = node.name
        else:
            preceding[node.name] = last
    return AirLayout(tuple(air), preceding)
