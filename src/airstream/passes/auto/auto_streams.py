"""``passes.auto_streams()``: streams without labels, by list scheduling on a cost model.

Each op gets a cost (``cost.py``). In graph order, each op goes to the stream where it would
finish first, given when each stream is free and when its inputs are ready (an input from another
stream adds the cost of a sync). The predicted makespan, plus the fixed cost of every side stream
used, is compared with running everything on one stream; below ``min_gain`` the graph is left
single-stream, so the pass never makes a model slower by its own estimate. Graphs that already
hold air ops are left alone (someone placed streams by hand). The decision is logged, kept on the
graph (``gm.meta["airstream_auto_streams"]``) and shown by ``airstream.explain``.

Before (two independent branches, all on main)::

    a1 = aten.mm(x, w1); a2 = aten.relu(a1)        # branch a
    b1 = aten.mm(x, w2); b2 = aten.relu(b1)        # branch b
    out = aten.add(a2, b2)

After (``max_streams=2``)::

    a1 = aten.mm(x, w1); a2 = aten.relu(a1)
    scope_enter(['_user_stream_label'], ['auto_1'])
    b1 = aten.mm(x, w2); b2 = aten.relu(b1)
    scope_exit()
    out = aten.add(a2, b2)                          # the planner adds the wait for b2
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from airstream.ops.library import is_air_op
from airstream.passes.auto.cost import CostModel, flops_cost, profile_cost
from airstream.passes.toolkit import place_on_stream

__all__ = ["AutoStreamsDecision", "auto_streams", "schedule"]

log = logging.getLogger("airstream.passes")

# What using a side stream costs a call, and what one cross-stream sync costs, on CPU
# (`airstream bench overhead`: a side stream ~60-110 us per call; a wake-up ~30 us).
SIDE_STREAM_SECONDS = 80e-6
SYNC_SECONDS = 30e-6


@dataclass(frozen=True)
class AutoStreamsDecision:
    """What auto_streams predicted and did."""

    single_stream_seconds: float
    multi_stream_seconds: float
    streams_used: int
    applied: bool

    @property
    def predicted_gain(self) -> float:
        """Single-stream time over the plan's predicted time."""
        return self.single_stream_seconds / max(self.multi_stream_seconds, 1e-12)

    def __str__(self) -> str:
        verdict = "applied" if self.applied else "kept single stream"
        return (
            f"auto_streams: predicted {self.single_stream_seconds * 1e3:.3f} ms on one stream, "
            f"{self.multi_stream_seconds * 1e3:.3f} ms on {self.streams_used} "
            f"(gain {self.predicted_gain:.2f}x): {verdict}"
        )


def schedule(
    nodes: Sequence[torch.fx.Node], cost: dict[torch.fx.Node, float], max_streams: int
) -> tuple[dict[torch.fx.Node, int], float]:
    """Greedy list scheduling in graph order: each node to the stream finishing it first.

    Returns node -> stream index (0 = main) and the predicted makespan."""
    free = [0.0] * max_streams
    finish: dict[torch.fx.Node, float] = {}
    where: dict[torch.fx.Node, int] = {}
    for node in nodes:
        best: tuple[float, int] | None = None
        for s in range(max_streams):
            ready = free[s]
            for arg in node.all_input_nodes:
                if arg in finish:
                    sync = SYNC_SECONDS if where[arg] != s else 0.0
                    ready = max(ready, finish[arg] + sync)
            end = ready + cost[node]
            if best is None or end < best[0] - 1e-12:
                best = (end, s)
        assert best is not None
        finish[node], where[node] = best
        free[best[1]] = best[0]
    return where, max(finish.values(), default=0.0)


def _pinned(node: torch.fx.Node) -> bool:
    # getitem runs with its producer; mutations keep their place on main (they end the graph).
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def auto_streams(max_streams: int = 2, cost_model: str = "flops", min_gain: float = 1.1) -> Any:
    """A pass assigning streams by list scheduling; see the module docstring."""
    if cost_model not in ("flops", "profile"):
        raise ValueError(
            f"auto_streams: cost_model must be 'flops' or 'profile', got {cost_model!r}"
        )
    if max_streams < 1:
        raise ValueError(f"auto_streams: max_streams must be >= 1, got {max_streams}")
    model: CostModel = flops_cost if cost_model == "flops" else profile_cost

    def auto_streams_pass(gm: torch.fx.GraphModule, inputs: Sequence[Any], cfg: Any) -> None:
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        if any(is_air_op(n.target) for n in calls):
            log.info("auto_streams: the graph already has stream markers; left alone")
            return
        cost = {n: (0.0 if _pinned(n) else model(n)) for n in calls}
        single = sum(cost.values())
        where, makespan = schedule(calls, cost, max_streams)
        for node in calls:  # pinned nodes follow their producer (or main)
            if _pinned(node):
                producer = node.args[0] if node.target is operator.getitem else None
                where[node] = where.get(producer, 0) if producer is not None else 0
        used = sorted({s for s in where.values()})
        predicted = makespan + SIDE_STREAM_SECONDS * (len(used) - 1)
        applied = len(used) > 1 and single / max(predicted, 1e-12) >= min_gain
        decision = AutoStreamsDecision(
            single, predicted if len(used) > 1 else single, len(used), applied
        )
        gm.meta["airstream_auto_streams"] = decision
        log.info("%s", decision)
        if not applied:
            return
        for s in used:
            if s != 0:
                place_on_stream(gm, [n for n in calls if where[n] == s], f"auto_{s}")

    return auto_streams_pass
