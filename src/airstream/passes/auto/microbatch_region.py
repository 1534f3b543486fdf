"""What :func:`airstream.passes.auto.microbatch.microbatch_overlap` splits: the token count and
which inputs hold tokens, the region of ops copied per micro-batch (every token-dependent op up
to the first that must not run per micro-batch, shrunk until every value leaving it joins back
into the whole one), the ops that run after it on the merged batch, and the stages the copies
run in (a stage ends at a collective's wait)."""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.nodes import describe, graph_kind
from airstream.passes.auto.token_dims import SCALAR, Label, Mixed, Rows, Stop, label_nodes
from airstream.passes.auto.token_rules import rows_of_size
from airstream.torch_internals import static_input_indices

__all__ = [
    "Refused",
    "Region",
    "Tokens",
    "feeding_collectives",
    "find_region",
    "find_tokens",
    "mergeable",
    "merged_part",
    "returned_views",
    "stages",
]


class Refused(Exception):
    """The graph cannot be split: the message names the node and why."""


@dataclass(frozen=True)
class Tokens:
    """The token count (an int, or the SymInt of a dynamic graph), its placeholder (dynamic),
    and the placeholders' labels: rows where an input's size is a multiple of it."""

    count: Any
    node: torch.fx.Node | None
    sources: dict[torch.fx.Node, Label]


@dataclass(frozen=True)
class Region:
    """The labels the region was found with, its ops, and why each token-dependent op left
    out was (the first of them is where the micro-batches merge)."""

    labels: dict[torch.fx.Node, Label]
    nodes: set[torch.fx.Node]
    why: dict[torch.fx.Node, str]


def find_tokens(gm: torch.fx.GraphModule) -> Tokens:
    """The token count: the leading size of the first input that is not a parameter (a dynamic
    graph's symbol; a static backward's gradients')."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # the parameters: AOTAutograd says for an inference or forward graph; a backward's inputs
    # are saved values and gradients (its context still describes the forward's inputs)
    static = set() if graph_kind(gm) == "backward" else set(static_input_indices() or ())
    data = [
        n
        for i, n in enumerate(placeholders)
        if i not in static and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim()
    ]
    if not data:
        raise Refused("no input holds tokens (every tensor input is a parameter or a scalar)")
    leading = [n.meta["val"].shape[0] for n in data]
    symbolic = [s for s in leading if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol]
    if symbolic:
        tokens: Any = symbolic[0]
    else:
        # a static graph: the gradients' leading size in a backward (its other inputs are saved
        # values, weights among them), else the first input's that is not a parameter
        grads = [n for n in data if n.name.startswith("tangents")]
        counts = Counter(int(n.meta["val"].shape[0]) for n in grads or data[:1])
        tokens = counts.most_common(1)[0][0]
    token_node = None
    sources: dict[torch.fx.Node, Label] = {}
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(tokens, torch.SymInt):
            if val.node.expr == tokens.node.expr:
                token_node = node
                sources[node] = SCALAR
            elif tokens.node.expr in val.node.expr.free_symbols:
                sources[node] = SCALAR  # a size saved by the forward (``2*s0``): a value
        elif node in data:
            found = _rows_of_input(val, tokens)
            if found is not None:
                sources[node] = found
    if isinstance(tokens, torch.SymInt) and token_node is None:
        raise Refused(f"the token count {tokens} is not an input of the graph")
    return Tokens(tokens, token_node, sources)


def _rows_of_input(val: torch.Tensor, tokens: Any) -> Rows | None:
    """An input's rows: a dynamic graph's at the dimension whose size is a multiple of the token
    count's symbol; a static graph's at the leading dimension where its size is a multiple of
    the count (a weight may be taken for rows: that only splits less, see :func:`find_region`)."""
    dims = range(val.dim()) if isinstance(tokens, torch.SymInt) else range(min(1, val.dim()))
    for dim in dims:
        per = rows_of_size(val.shape[dim], tokens)
        if per is not None:
            return Rows(dim, per)
    return None


def find_region(graph: torch.fx.Graph, tokens: Tokens) -> list[Region]:
    """The labellings' regions, the one splitting the most collectives (then ops) first. Any
    labelling of the inputs is sound (an input taken for rows is sliced, and every rule claims
    rows only where each row depends on its own rows of every input; one not taken is shared
    whole), so a static graph, whose sizes cannot tell a token's rows from a weight's that
    happens to be a multiple of the count, tries the inputs of one row per token alone too, and
    its factories of such sizes as rows and as shared
    (:func:`~airstream.passes.auto.token_rules.factory`)."""
    tries = [(tokens.sources, True)]
    if not isinstance(tokens.count, torch.SymInt):
        single = {
            n: lab for n, lab in tokens.sources.items() if not isinstance(lab, Rows) or lab.per == 1
        }
        tries = [(tokens.sources, True), (tokens.sources, False), (single, True), (single, False)]
    found: list[tuple[tuple[int, int], int, Region]] = []
    for tried, factory_rows in tries:
        labels = label_nodes(graph, tried, tokens.count, factory_rows)
        nodes, why = _region(graph, labels)
        score = (sum(1 for n in nodes if effects(n).collective), len(nodes))
        found.append((score, -len(found), Region(labels, nodes, why)))
    found.sort(key=lambda f: f[:2], reverse=True)
    return [region for _, _, region in found]


def _region(
    graph: torch.fx.Graph, labels: dict[torch.fx.Node, Label]
) -> tuple[set[torch.fx.Node], dict[torch.fx.Node, str]]:
    """The ops copied per micro-batch, and why each token-dependent op left out was."""
    why: dict[torch.fx.Node, str] = {}
    region: set[torch.fx.Node] = set()
    for node in graph.nodes:
        lab = labels[node]
        if node.op != "call_function" or lab is None or lab == SCALAR:
            continue
        if isinstance(lab, Stop):
            why[node] = f"{lab.why}: {lab.at}" if lab.at else lab.why
            continue
        region.add(node)
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node not in region:
                continue
            lab = labels[node]
            reason = None
            # a value no op reads is kept only if it joins back: a collective of a mixed value
            # run per micro-batch would compute what the whole batch does not
            outside = [u for u in node.users if u not in region]
            if (outside or not node.users) and not mergeable(node, lab):
                reason = _why_left(node, lab, outside, why)
            late = [a for a in node.all_input_nodes if a not in region and _after(a, region)]
            if late:
                reason = f"it needs {describe(late[0])}, which runs on the whole batch"
            if reason is not None:
                _drop(node, region, why, reason)
                changed = True
    return region, why


def returned_views(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The graph's outputs that are views of another value (of an input, or of an output
    AOTAutograd returns as their base), and the views they were made through: they must stay
    views of that value's memory: the graph returns them made anew from the merged batch."""
    output = next(n for n in graph.nodes if n.op == "output")
    found: set[torch.fx.Node] = set()
    stack = [n for n in output.all_input_nodes if _is_view(n)]
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        stack.extend(a for a in node.all_input_nodes if _is_view(a))
    return found


def _is_view(node: torch.fx.Node) -> bool:
    """A call whose result shares its input's memory (an element of a tuple of views too)."""
    if node.op != "call_function":
        return False
    source = node.args[0] if node.target is operator.getitem else node
    return isinstance(source, torch.fx.Node) and effects(source).view


def mergeable(node: torch.fx.Node, lab: Label) -> bool:
    """Whether the micro-batches' values of ``node`` join into the whole one: rows in order,
    concatenated, or blocks of rows whose other dimensions are static (joined block by block)."""
    if not isinstance(lab, Rows) or lab.fresh or lab.by:
        return False
    if lab.blocks == 1:
        return True
    size = node.meta["val"].shape
    return all(isinstance(s, int) for i, s in enumerate(size) if i != lab.dim)


def _why_left(
    node: torch.fx.Node, lab: Label, outside: list[torch.fx.Node], why: dict[torch.fx.Node, str]
) -> str:
    """Why ``node``, whose value does not join back, leaves the region: what its first reader
    outside it left for, or that the graph returns it."""
    if any(u.op == "output" for u in outside):
        return (
            "the graph returns a value that would not join back into the whole batch's (the "
            f"output, a value saved for the backward, a weight's gradient): {_what(lab)}"
        )
    reader = next((u for u in outside if u in why), None)
    if reader is not None:
        return why[reader]
    return f"it depends on a value that is not indexed by tokens: {_what(lab)}"


def _what(lab: Label) -> str:
    if isinstance(lab, (Mixed, Stop)):
        return f"{lab.why}: {lab.at}" if lab.at else lab.why
    if isinstance(lab, Rows):
        if lab.by:
            return "the micro-batch's rows in the order a sort gave them"
        return f"{lab.blocks} blocks of rows, one per rank" if lab.blocks > 1 else "a new buffer"
    if isinstance(lab, tuple):
        return "values of which one does not join back"
    return "positions within the micro-batch"


def _after(node: torch.fx.Node, region: set[torch.fx.Node]) -> bool:
    """Whether ``node`` (outside the region) depends on a region op."""
    seen: set[torch.fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in region:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def _drop(
    node: torch.fx.Node, region: set[torch.fx.Node], why: dict[torch.fx.Node, str], reason: str
) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        if n in region:
            region.discard(n)
            why.setdefault(n, reason)
            stack.extend(n.users)


def _ordered(node: torch.fx.Node) -> bool:
    found = effects(node)
    return found.collective or found.collective_wait or found.random or bool(found.writes)


def merged_part(graph: torch.fx.Graph, region: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The ops that run after the micro-batches, on the merged batch: those that need a region
    op, and ordered ops (collectives, random, writes) that come after the region's first op,
    which must not move before the micro-batches' collectives; and what needs them."""
    out: set[torch.fx.Node] = set()
    started = False
    for node in graph.nodes:
        started = started or node in region
        if node in region or node.op != "call_function":
            continue
        needs = any(a in region or a in out for a in node.all_input_nodes)
        if needs or _after(node, region) or (started and _ordered(node)):
            out.add(node)
    for node in graph.nodes:
        late = [a for a in node.all_input_nodes if a in out]
        if node in region and late:
            raise Refused(
                f"{describe(node)} would run per micro-batch but needs {describe(late[0])}, "
                "which must keep its place after the split"
            )
    return out


def stages(graph: torch.fx.Graph, region: set[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """Each region op's stage: the collective waits on its longest path from the inputs."""
    stage: dict[torch.fx.Node, int] = {}
    for node in graph.nodes:
        if node in region:
            before = [stage[a] for a in node.all_input_nodes if a in region]
            stage[node] = max(before, default=0) + (1 if effects(node).collective_wait else 0)
    return stage


def feeding_collectives(
    graph: torch.fx.Graph, region: set[torch.fx.Node], stage: dict[torch.fx.Node, int]
) -> set[torch.fx.Node]:
    """The region's collectives and, in their stage, the ops they need: run first in a stage, so
    the collective is issued before the stage's other compute."""
    feeds: set[torch.fx.Node] = set()
    for node in reversed(list(graph.nodes)):
        if node not in region:
            continue
        if effects(node).collective or any(
            u in feeds and stage[u] == stage[node] for u in node.users
        ):
            feeds.add(node)
    return feeds
