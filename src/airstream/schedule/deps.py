"""Ordering requirements of a graph beyond program order: which earlier nodes each node needs.

Five sources (docs/design.md section 3, "Stream semantics"): data edges, control edges (``wait``,
``wait_tensor``), mutation (a write runs after every earlier reader and writer of the same
storage, and a read after the last earlier write), RNG (ops drawing from the global generator
keep graph order) and collectives (``torch.distributed`` functional collectives are issued in
graph order on whatever streams they run, so every rank issues them in the same order and no
placement can pair one rank's all_reduce with another rank's all_gather). The planner turns the
cross-stream ones into event syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx

from airstream.effects import effects, is_executed
from airstream.ops.library import record, wait, wait_tensor

__all__ = ["Requirement", "requirements"]


@dataclass(frozen=True)
class Requirement:
    """``node`` must not start before ``before`` has completed, because of ``reason``."""

    before: torch.fx.Node
    reason: str  # "data", "control", "mutation", "rng" or "collective"


class _Storages:
    """Which nodes may share storage: a union-find over aliasing (views, in-place results,
    tuple elements, fused segments returning an input's view)."""

    def __init__(self) -> None:
        self.parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(self, node: torch.fx.Node) -> torch.fx.Node:
        """The storage ``node`` belongs to (its root); iterative, with path compression."""
        root = node
        while (parent := self.parent.get(root, root)) is not root:
            root = parent
        while node is not root:
            following = self.parent[node]
            self.parent[node] = root
            node = following
        return root

    def join(
        self, node: torch.fx.Node, sources: tuple[torch.fx.Node, ...]
    ) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
        """Put ``node`` (new) into its sources' storage, merging theirs if they differ; return
        the storage and the roots merged into it."""
        roots = list(dict.fromkeys(self.find(s) for s in sources))
        root = roots[0]
        self.parent[node] = root
        for other in roots[1:]:
            self.parent[other] = root
        return root, roots[1:]


def requirements(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[Requirement]]:
    """For every executed node and every ``wait`` node, what must complete before it.

    ``before`` is always earlier in graph order. A requirement on a record token means "everything
    on the record's stream up to the record"; the planner resolves it to a position. The effects
    of each node come from :mod:`airstream.effects`.
    """
    storages = _Storages()
    last_write: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # the last write(s) per storage
    reads_since_write: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    last_random: torch.fx.Node | None = None
    last_collective: torch.fx.Node | None = None
    out: dict[torch.fx.Node, list[Requirement]] = {}

    def rebase(old: torch.fx.Node, new: torch.fx.Node) -> None:
        # Two storages merged: what was known about the old root now belongs to the new one.
        last_write.setdefault(new, []).extend(last_write.pop(old, []))
        reads_since_write.setdefault(new, []).extend(reads_since_write.pop(old, []))

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        reqs: list[Requirement] = []
        if node.target is wait:
            reqs += [Requirement(dep, "control") for dep in node.args[0]]
            out[node] = reqs
            continue
        if not is_executed(node):
            continue
        for arg in node.all_input_nodes:
            if arg.target is record and not is_executed(arg):
                continue
            kind = "control" if node.target is wait_tensor and arg is node.args[1] else "data"
            reqs.append(Requirement(arg, kind))
        found = effects(node)
        if found.aliases:
            root, merged = storages.join(node, found.aliases)
            for old in merged:
                rebase(old, root)
        written = {storages.find(w) for w in found.writes}
        for arg in node.all_input_nodes:
            base = storages.find(arg)
            reqs += [Requirement(w, "mutation") for w in last_write.get(base, ()) if w is not node]
        for base in written:
            reqs += [Requirement(r, "mutation") for r in reads_since_write.get(base, [])]
            reqs += [Requirement(w, "mutation") for w in last_write.get(base, ())]
            last_write[base] = [node]
            reads_since_write[base] = []
        for arg in node.all_input_nodes:
            base = storages.find(arg)
            if base not in written:
                reads_since_write.setdefault(base, []).append(node)
        if found.random:
            if last_random is not None:
                reqs.append(Requirement(last_random, "rng"))
            last_random = node
        if found.collective:
            if last_collective is not None:
                reqs.append(Requirement(last_collective, "collective"))
            last_collective = node
        out[node] = [r for r in reqs if r.before is not node]
    return out
