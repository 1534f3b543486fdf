"""``passes.shared_expert_overlap()``: a DeepSeek/Qwen-style shared expert on its own stream.

Before::

    router = aten.mm(x, w_gate)               # gate
    ... routed experts ...
    shared = aten.addmm(b, x, w_shared_up)    # shared_expert.up
    ...
    out    = aten.add(routed, shared_out)

After::

    router = aten.mm(x, w_gate)
    ... routed experts (main stream, whatever their form) ...
    scope_enter(['_user_stream_label'], ['shared_expert'])
    shared = aten.addmm(b, x, w_shared_up)
    ...
    scope_exit()
    out    = aten.add(routed, shared_out)      # the planner makes main wait for shared_out

The shared expert only needs the block's input, so its stream starts at once and overlaps the
router and the routed experts. Its ops that must run with the caller's threads
(:mod:`airstream.graph.foreign_ops`: vLLM's linears) stay on the main stream, with a warning; where
they are most of its work (by :func:`~airstream.passes.auto.cost.flops_cost`), what is left
would pay a side stream's handoffs to overlap next to nothing (vLLM's CPU build: 0.40-0.76x),
so the whole shared expert stays on the main stream, and the warning says so.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any

import torch.fx

from airstream.graph.effects import effects
from airstream.graph.foreign_ops import caller_threads_why
from airstream.passes.auto.cost import flops_cost
from airstream.passes.toolkit import place_on_stream, select_nodes

__all__ = ["shared_expert_overlap"]

# The share of the shared expert's estimated work its side stream must keep to be worth placing
# where some of its ops stay on main.
MIN_SHARE = 0.5

log = logging.getLogger("airstream.passes")


def shared_expert_overlap(shared: str = r"shared_expert", label: str = "shared_expert") -> Any:
    """A pass putting every node under a module matching ``shared`` on stream ``label``."""

    def shared_expert_pass(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any
    ) -> None:
        nodes = select_nodes(gm, module=shared)
        if not nodes:
            log.info("shared_expert_overlap: no module matches %r; graph left alone", shared)
            return
        kept = [n for n in nodes if not effects(n).caller_threads]
        if len(kept) < len(nodes):
            first = next(n for n in nodes if effects(n).caller_threads)
            share = _share(kept, nodes)
            if not kept:
                outcome = ": nothing is left to overlap"
            elif share < MIN_SHARE:
                outcome = (
                    f"; the rest, {share:.0%} of its estimated work, would not pay for a side "
                    "stream's handoffs, so the whole shared expert stays there"
                )
            else:
                outcome = ""
            log.warning(
                "shared_expert_overlap: %d of the %d node(s) under %r stay on the main stream, "
                "where they run alone with the caller's threads "
                "(%s; airstream.graph.foreign_ops)%s",
                len(nodes) - len(kept),
                len(nodes),
                shared,
                caller_threads_why((first.target, *first.args)) or "declared",
                outcome,
            )
            if share < MIN_SHARE:
                return
        if not kept:
            return
        pairs = place_on_stream(gm, kept, label)
        log.info("shared_expert_overlap: %d node(s) on %r (%d scope(s))", len(kept), label, pairs)

    return shared_expert_pass


def _cost(node: torch.fx.Node) -> float:
    """``node``'s estimated seconds (none for taking an element of a tuple)."""
    return 0.0 if node.target is operator.getitem else flops_cost(node)


def _share(kept: Sequence[torch.fx.Node], nodes: Sequence[torch.fx.Node]) -> float:
    """``kept``'s share of ``nodes``' estimated seconds (1.0 where nothing has a cost)."""
    total = sum(_cost(n) for n in nodes)
    return sum(_cost(n) for n in kept) / total if total > 0 else 1.0
