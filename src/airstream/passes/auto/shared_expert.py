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
(:mod:`airstream.foreign_ops`: vLLM's linears) stay on the main stream, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch.fx

from airstream.effects import effects
from airstream.foreign_ops import caller_threads_why
from airstream.passes.toolkit import place_on_stream, select_nodes

__all__ = ["shared_expert_overlap"]

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
            log.warning(
                "shared_expert_overlap: %d of the %d node(s) under %r stay on the main stream, "
                "where they run alone with the caller's threads (%s; airstream.foreign_ops)%s",
                len(nodes) - len(kept),
                len(nodes),
                shared,
                caller_threads_why((first.target, *first.args)) or "declared",
                "" if kept else ": nothing is left to overlap",
            )
        if not kept:
            return
        pairs = place_on_stream(gm, kept, label)
        log.info("shared_expert_overlap: %d node(s) on %r (%d scope(s))", len(kept), label, pairs)

    return shared_expert_pass
