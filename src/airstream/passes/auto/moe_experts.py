"""``passes.moe_experts()``: each MoE expert's nodes on a stream of their own.

Before (experts run one after another on the main stream)::

    addmm   = aten.addmm(b0, x, t0)        # experts.0.up
    ...                                     # experts.0.down
    addmm_2 = aten.addmm(b1, x, t1)        # experts.1.up
    ...

After (``num_streams=2``: even experts stay on main, odd ones go to ``moe_expert_1``)::

    addmm   = aten.addmm(b0, x, t0)
    scope_enter(['_user_stream_label'], ['moe_expert_1'])
    addmm_2 = aten.addmm(b1, x, t1)
    ...
    scope_exit()

The planner adds the syncs where expert outputs are combined. Forward and backward graphs alike
(backward nodes carry the forward module path). Experts found by a regex over module paths whose
first group is the expert index; a model whose experts are one batched op has no such paths, and
the pass says so in one log line and leaves the graph alone.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import torch.fx

from airstream.passes.toolkit import module_paths, place_on_stream, select_nodes

__all__ = ["moe_experts"]

log = logging.getLogger("airstream.passes")


def _default_streams(experts: int) -> int:
    # One stream per expert, bounded by the cores: more streams than cores only contend.
    return max(1, min(experts, os.cpu_count() or 1))


def moe_experts(pattern: str = r"experts\.(\d+)", num_streams: int | None = None) -> Any:
    """A pass putting expert ``i`` on stream slot ``i % num_streams`` (slot 0 is main)."""
    regex = re.compile(pattern)
    if regex.groups < 1:
        raise ValueError(f"moe_experts: pattern {pattern!r} needs a group capturing the index")
    if num_streams is not None and num_streams < 1:
        raise ValueError(f"moe_experts: num_streams must be >= 1, got {num_streams}")

    def moe_experts_pass(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any) -> None:
        groups: dict[int, list[torch.fx.Node]] = {}
        for node in select_nodes(gm, module=regex):
            index = next(int(m.group(1)) for p in module_paths(node) if (m := regex.search(p)))
            groups.setdefault(index, []).append(node)
        if not groups:
            batched = select_nodes(gm, module=r"experts")
            if batched:
                log.info(
                    "moe_experts: the experts are one batched op (%d node(s) under 'experts' with "
                    "no per-expert module path): left as they are",
                    len(batched),
                )
            return
        streams = num_streams or _default_streams(len(groups))
        slots: dict[int, list[torch.fx.Node]] = {}
        for index, nodes in sorted(groups.items()):
            slots.setdefault(index % streams, []).extend(nodes)
        for slot, nodes in slots.items():
            if slot != 0:
                place_on_stream(gm, sorted(nodes, key=_order(gm)), f"moe_expert_{slot}")
        log.info("moe_experts: %d experts on %d stream(s)", len(groups), min(streams, len(groups)))

    return moe_experts_pass


def _order(gm: torch.fx.GraphModule) -> Any:
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return index.__getitem__
