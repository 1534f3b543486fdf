"""Ordering requirements of a graph beyond program order: which earlier nodes each node needs.

Five sources (DESIGN.md section 3): data edges, control edges (``wait``, ``wait_tensor``),
mutation (a write runs after every earlier reader and writer of the same storage, and a read after
the last earlier write), RNG (ops drawing from the global generator keep graph order) and
collectives (``torch.distributed`` functional collectives are issued in graph order on whatever
streams they run, so every rank issues them in the same order and no placement can pair one
rank's all_reduce with another rank's all_gather). The planner turns the cross-stream ones into
event syncs.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.fx

from airstream.nodes import is_collective
from airstream.ops.library import record, scope_enter, scope_exit, wait, wait_tensor
from airstream.torch_internals import OpOverload, op_schema

__all__ = ["Requirement", "is_executed", "requirements"]


@dataclass(frozen=True)
class Requirement:
    """``node`` must not start before ``before`` has completed, because of ``reason``."""

    before: torch.fx.Node
    reason: str  # "data", "control", "mutation", "rng" or "collective"


def is_executed(node: torch.fx.Node) -> bool:
    """True for nodes that run as a step: every call except markers, waits and bare records."""
    if node.op != "call_function" or node.target in (scope_enter, scope_exit, wait):
        return False
    if node.target is record:
        # A token that only feeds waits is an event position, not work.
        return any(user.target is not wait for user in node.users)
    return True


def _schema(node: torch.fx.Node) -> torch.FunctionSchema | None:
    return op_schema(node.target)


def _aliased_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose storage ``node``'s result shares (views, in-place ops, getitem...)."""
    if node.target is wait_tensor or node.target is operator.getitem:
        arg = node.args[0]
        return arg if isinstance(arg, torch.fx.Node) else None
    schema = _schema(node)
    if schema is None:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None:  # a view's input, or the tensor an in-place op returns
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            return value if isinstance(value, torch.fx.Node) else None
    return None


def _written_inputs(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    schema = _schema(node)
    if schema is None or not schema.is_mutable:
        return
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            yield from (v for v in values if isinstance(v, torch.fx.Node))


def _is_random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, OpOverload) and (torch.Tag.nondeterministic_seeded in target.tags)


def requirements(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[Requirement]]:
    """For every executed node and every ``wait`` node, what must complete before it.

    ``before`` is always earlier in graph order. A requirement on a record token means "everything
    on the record's stream up to the record"; the planner resolves it to a position.
    """
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    last_write: dict[torch.fx.Node, torch.fx.Node] = {}
    reads_since_write: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    last_random: torch.fx.Node | None = None
    last_collective: torch.fx.Node | None = None
    out: dict[torch.fx.Node, list[Requirement]] = {}

    def storage(n: torch.fx.Node) -> torch.fx.Node:
        return root.get(n, n)

    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            root[node] = node
            continue
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
        aliased = _aliased_input(node)
        root[node] = storage(aliased) if aliased is not None else node
        written = {storage(w) for w in _written_inputs(node)}
        for arg in node.all_input_nodes:
            base = storage(arg)
            if base in last_write and last_write[base] is not node:
                reqs.append(Requirement(last_write[base], "mutation"))
        for base in written:
            reqs += [Requirement(r, "mutation") for r in reads_since_write.get(base, [])]
            if base in last_write:
                reqs.append(Requirement(last_write[base], "mutation"))
            last_write[base] = node
            reads_since_write[base] = []
        for arg in node.all_input_nodes:
            base = storage(arg)
            if base not in written:
                reads_since_write.setdefault(base, []).append(node)
        if _is_random(node):
            if last_random is not None:
                reqs.append(Requirement(last_random, "rng"))
            last_random = node
        if is_collective(node):
            if last_collective is not None:
                reqs.append(Requirement(last_collective, "collective"))
            last_collective = node
        out[node] = [r for r in reqs if r.before is not node]
    return out
