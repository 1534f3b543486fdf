"""``passes.overlap_communication()``: collectives on a communication stream.

Before (one tensor-parallel layer; everything on main)::

    h      = aten.mm(x, w_col)                          # column-parallel Linear
    g      = aten.gelu(h)
    part   = aten.mm(g, w_row)                          # row-parallel Linear
    ar     = _c10d_functional.all_reduce(part, "sum", "0")
    red    = _c10d_functional.wait_tensor(ar)           # blocks until the sum arrived
    branch = aten.gelu(aten.mm(x, w_branch))            # independent compute
    out    = aten.add(red, branch)

After::

    scope_enter(['_user_stream_label'], ['comm'])
    h, g, part, ar, red                                 # what only the collective needs, the
    scope_exit()                                        # collective and its wait
    branch = ...                                        # main: proceeds while comm waits
    out    = aten.add(red, branch)                      # the planner makes main wait for red

Every functional collective, its ``wait_tensor`` and, walking back from them, every main-stream
op whose results only they (transitively) use move to stream ``label``. Then, within each run of
ops between markers, the ops that need a collective's result move after the ones that do not
(``sink``): Dynamo's order often puts the first use of the sum before the independent branch,
which would make main wait for the communication before it computes the branch. Ops used by
anything else (another branch, the graph's outputs, tensors saved for backward) stay on their
stream; so do ops a pass already put on another stream. Collectives keep their graph order
across streams (the planner's ``collective`` rule), so every rank issues them in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.ops.library import STREAM_LABEL_KEY, is_air_op, scope_enter, scope_exit
from airstream.ops.stream import STREAM_ANNOTATION
from airstream.passes.toolkit import place_on_stream
from airstream.torch_internals import require, stream_annotations

__all__ = ["overlap_communication"]

log = logging.getLogger("airstream.passes")


def _placed(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes something already put on a stream: inside a stream scope, or annotated."""
    placed = set()
    labels: list[bool] = []  # per open scope: does it set a stream?
    for node in graph.nodes:
        if node.target is scope_enter:
            labels.append(STREAM_LABEL_KEY in node.args[0])
        elif node.target is scope_exit:
            if labels:
                labels.pop()
        elif any(labels) or stream_annotations(node).get(STREAM_ANNOTATION):
            placed.add(node)
    return placed


def _sink_dependents(graph: torch.fx.Graph, comm: set[torch.fx.Node]) -> int:
    """In each marker-free run of other nodes, put the ones that need a ``comm`` result after the
    ones that do not (stable), so the stream they run on does its independent work before it
    waits. Runs holding random or mutating ops keep their order (RNG and write order)."""
    moved = 0
    run: list[torch.fx.Node] = []
    needs: set[torch.fx.Node] = set(comm)

    def flush() -> None:
        nonlocal moved
        dependent = [n for n in run if n in needs]
        if not dependent or len(dependent) == len(run) or any(_ordered(n) for n in run):
            run.clear()
            return
        independent = [n for n in run if n not in needs]
        anchor = run[-1].next
        for node in independent + dependent:
            anchor.prepend(node)
        moved += sum(1 for a, b in zip(run, independent + dependent, strict=True) if a is not b)
        run.clear()

    for node in list(graph.nodes):
        if node.op in ("placeholder", "get_attr") or node in comm:
            flush()
            continue
        if node.op != "call_function" or is_air_op(node.target):
            flush()
            continue
        if any(arg in needs for arg in node.all_input_nodes):
            needs.add(node)
        run.append(node)
    flush()
    return moved


def _ordered(node: torch.fx.Node) -> bool:
    """Random or mutating: its place in graph order matters beyond data edges."""
    found = effects(node)
    return found.random or found.mutates


def overlap_communication(label: str = "comm", producers: bool = True, sink: bool = True) -> Any:
    """A pass moving collectives, their waits and (``producers``) what only they need to stream
    ``label``; with ``sink``, ops that need a collective's result move after the independent ops
    that follow them (never across a marker, a random or a mutating op)."""
    require("collectives")

    def overlap_communication_pass(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any
    ) -> None:
        graph = gm.graph
        collectives = [n for n in graph.nodes if effects(n).collective]
        if not collectives:
            log.info("overlap_communication: no collective in the graph; left alone")
            return
        placed = _placed(graph)
        chosen: set[torch.fx.Node] = set()
        for node in collectives:
            if node in placed:
                continue  # a pass or the model already put it on a stream
            chosen.add(node)
            chosen.update(u for u in node.users if effects(u).collective_wait and u not in placed)
        if producers:
            for node in reversed(list(graph.nodes)):
                if (
                    node in chosen
                    or node.op != "call_function"
                    or is_air_op(node.target)
                    or node in placed
                ):
                    continue
                if node.users and all(user in chosen for user in node.users):
                    chosen.add(node)
        nodes = [n for n in graph.nodes if n in chosen]
        if not nodes:
            return
        if sink:
            moved = _sink_dependents(graph, chosen)
            log.info("overlap_communication: %d op(s) moved after independent work", moved)
        pairs = place_on_stream(gm, nodes, label)
        log.info(
            "overlap_communication: %d collective(s), %d node(s) on %r (%d scope(s))",
            len(collectives),
            len(nodes),
            label,
            pairs,
        )

    return overlap_communication_pass
