"""Ordering requirements of a graph beyond program order: which earlier nodes each node needs.

Seven sources (docs/design.md section 3, "Stream semantics"): data edges, control edges (``wait``,
``wait_tensor``), mutation (a write runs after every earlier reader and writer of the same
storage, and a read after the last earlier write), RNG (ops drawing from the global generator
keep graph order), collectives (``torch.distributed`` functional collectives are issued in graph
order on whatever streams they run, so every rank issues them in the same order and no placement
can pair one rank's all_reduce with another rank's all_gather) and shared state (ops sharing a
process-global state, such as vLLM's CPU scratchpad, run one at a time, in graph order:
:mod:`airstream.graph.foreign_ops`); an op that needs the caller's threads (vLLM's CPU attention)
runs alone, after every earlier node and before every later one. The planner turns the cross-stream
ones into event syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx

from airstream.graph.effect_queries import is_executed
from airstream.graph.effects import Effects, effects
from airstream.ops.library import record, wait, wait_tensor

__all__ = ["Requirement", "requirements"]


@dataclass(frozen=True)
class Requirement:
    """``node`` must not start before ``before`` has completed, because of ``reason``."""

    before: torch.fx.Node
    # "data", "control", "mutation", "rng", "collective", "shared state" or "alone"
    reason: str


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


class _Order:
    """What the walk has seen so far: each storage's last write(s) and the reads since, the last
    random op, the last collective and the last op sharing each process-global state."""

    def __init__(self) -> None:
        self.storages = _Storages()
        self.last_write: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # per storage
        self.reads_since_write: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        self.last_random: torch.fx.Node | None = None
        self.last_collective: torch.fx.Node | None = None
        self.last_sharing: dict[str, torch.fx.Node] = {}  # per shared state
        self.last_alone: torch.fx.Node | None = None  # the last op that runs alone
        self.since_alone: list[torch.fx.Node] = []  # every executed node after it

    def _rebase(self, old: torch.fx.Node, new: torch.fx.Node) -> None:
        """Two storages merged: what was known about the old root now belongs to the new one."""
        self.last_write.setdefault(new, []).extend(self.last_write.pop(old, []))
        self.reads_since_write.setdefault(new, []).extend(self.reads_since_write.pop(old, []))

    def memory(self, node: torch.fx.Node, found: Effects) -> list[Requirement]:
        """``node``'s mutation requirements: after the last writes of what it reads, and, for
        what it writes, after the reads since the last write and that write."""
        storages = self.storages
        if found.aliases:
            root, merged = storages.join(node, found.aliases)
            for old in merged:
                self._rebase(old, root)
        written = {storages.find(w) for w in found.writes}
        reqs: list[Requirement] = []
        for arg in node.all_input_nodes:
            base = storages.find(arg)
            last = self.last_write.get(base, ())
            reqs += [Requirement(w, "mutation") for w in last if w is not node]
        for base in written:
            reqs += [Requirement(r, "mutation") for r in self.reads_since_write.get(base, [])]
            reqs += [Requirement(w, "mutation") for w in self.last_write.get(base, ())]
            self.last_write[base] = [node]
            self.reads_since_write[base] = []
        for arg in node.all_input_nodes:
            base = storages.find(arg)
            if base not in written:
                self.reads_since_write.setdefault(base, []).append(node)
        return reqs

    def issue_order(self, node: torch.fx.Node, found: Effects) -> list[Requirement]:
        """Random ops in graph order (one generator state), collectives too (every rank), and
        ops sharing a process-global state (never two at once)."""
        reqs: list[Requirement] = []
        if found.random:
            if self.last_random is not None:
                reqs.append(Requirement(self.last_random, "rng"))
            self.last_random = node
        if found.collective:
            if self.last_collective is not None:
                reqs.append(Requirement(self.last_collective, "collective"))
            self.last_collective = node
        for state in found.shared_state:
            if (last := self.last_sharing.get(state)) is not None:
                reqs.append(Requirement(last, "shared state"))
            self.last_sharing[state] = node
        return reqs

    def alone(self, node: torch.fx.Node, found: Effects) -> list[Requirement]:
        """An op that needs the caller's threads runs after everything before it; everything
        after it runs after it: no other stream works while it runs."""
        before = self.since_alone if found.caller_threads else []
        if self.last_alone is not None:
            before = [self.last_alone, *before]
        if found.caller_threads:
            self.last_alone, self.since_alone = node, []
        else:
            self.since_alone.append(node)
        return [Requirement(b, "alone") for b in before]


def _data(node: torch.fx.Node) -> list[Requirement]:
    """``node``'s inputs (a ``wait_tensor``'s dependency as ordering only), record tokens that
    stand for a position left out."""
    reqs = []
    for arg in node.all_input_nodes:
        if arg.target is record and not is_executed(arg):
            continue
        kind = "control" if node.target is wait_tensor and arg is node.args[1] else "data"
        reqs.append(Requirement(arg, kind))
    return reqs


def requirements(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[Requirement]]:
    """For every executed node and every ``wait`` node, what must complete before it.

    ``before`` is always earlier in graph order. A requirement on a record token means "everything
    on the record's stream up to the record"; the planner resolves it to a position. The effects
    of each node come from :mod:`airstream.graph.effects`.
    """
    seen = _Order()
    out: dict[torch.fx.Node, list[Requirement]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is wait:
            out[node] = [Requirement(dep, "control") for dep in node.args[0]]
            continue
        if not is_executed(node):
            continue
        found = effects(node)
        reqs = _data(node) + seen.memory(node, found) + seen.issue_order(node, found)
        reqs += seen.alone(node, found)
        out[node] = [r for r in reqs if r.before is not node]
    return out
