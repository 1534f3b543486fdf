"""``passes.auto_streams()``: streams without labels, by graph structure and list scheduling.

First, roles that serving stacks place on side streams by hand are looked for by structure
(``patterns.py``): a shared expert beside the routed experts of a MoE block. If there are any, and
the token count their matrix multiplies see is at most ``max_tokens`` (side streams pay in
decode, not in long prefills), they go to one side stream (``auto_shared``, reused by every layer)
when the cost model predicts at least ``min_gain``. Otherwise the general list scheduler below
decides.

Each op gets a cost (``cost.py``). Each op in turn goes to the stream where it would finish
first, given when each stream is free and when its inputs are ready (an input from another stream
adds the cost of a sync). Ops are taken in graph order; when nothing in the graph depends on order
(no mutation, no RNG op) they are taken by upward rank instead (HEFT: longest remaining path
first) and the graph is reordered by predicted start time, since each stream runs its ops in graph
order. The predicted makespan, plus the fixed cost of every side stream used, is compared with
running everything on one stream; below ``min_gain`` the graph is left
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

import torch
import torch.fx

from airstream.effects import effects
from airstream.ops.library import is_air_op
from airstream.passes.auto.cost import CostModel, flops_cost, profile_cost
from airstream.passes.auto.patterns import shared_experts
from airstream.passes.toolkit import place_on_stream
from airstream.torch_internals import require

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
    pattern: str = ""  # the structural role placed, if one was
    declined: str = ""  # why a structural role found was not placed

    @property
    def predicted_gain(self) -> float:
        """Single-stream time over the plan's predicted time."""
        return self.single_stream_seconds / max(self.multi_stream_seconds, 1e-12)

    def __str__(self) -> str:
        verdict = "applied" if self.applied else "kept single stream"
        how = f" ({self.pattern})" if self.pattern else ""
        declined = f"; {self.declined}" if self.declined else ""
        return (
            f"auto_streams: predicted {self.single_stream_seconds * 1e3:.3f} ms on one stream, "
            f"{self.multi_stream_seconds * 1e3:.3f} ms on {self.streams_used} "
            f"(gain {self.predicted_gain:.2f}x): {verdict}{how}{declined}"
        )


def _upward_rank(nodes: Sequence[torch.fx.Node], cost: dict[torch.fx.Node, float]) -> dict:
    """Longest cost path from each node to the end of the graph (HEFT's priority)."""
    rank: dict[torch.fx.Node, float] = {}
    members = set(nodes)
    for node in reversed(nodes):
        after = [rank[u] for u in node.users if u in members]
        rank[node] = cost[node] + (max(after) if after else 0.0)
    return rank


def schedule(
    nodes: Sequence[torch.fx.Node],
    cost: dict[torch.fx.Node, float],
    max_streams: int,
    by_rank: bool = False,
) -> tuple[dict[torch.fx.Node, int], dict[torch.fx.Node, float], float]:
    """List scheduling: each node, when ready, to the stream finishing it first.

    ``by_rank``: nodes are taken in order of upward rank (HEFT), else in graph order. Returns
    node -> stream (0 = main), node -> predicted start, and the predicted makespan."""
    members = set(nodes)
    index = {n: i for i, n in enumerate(nodes)}
    if by_rank:
        rank = _upward_rank(nodes, cost)
        waiting = {n: sum(1 for a in n.all_input_nodes if a in members) for n in nodes}
        ready = [n for n in nodes if waiting[n] == 0]
        order: list[torch.fx.Node] = []
        while ready:
            ready.sort(key=lambda n: (-rank[n], index[n]))
            node = ready.pop(0)
            order.append(node)
            for user in node.users:
                if user in members:
                    waiting[user] -= 1
                    if waiting[user] == 0:
                        ready.append(user)
    else:
        order = list(nodes)
    free = [0.0] * max_streams
    finish: dict[torch.fx.Node, float] = {}
    start: dict[torch.fx.Node, float] = {}
    where: dict[torch.fx.Node, int] = {}
    for node in order:
        best: tuple[float, float, int] | None = None
        for s in range(max_streams):
            ready_at = free[s]
            for arg in node.all_input_nodes:
                if arg in finish:
                    sync = SYNC_SECONDS if where[arg] != s else 0.0
                    ready_at = max(ready_at, finish[arg] + sync)
            end = ready_at + cost[node]
            if best is None or end < best[0] - 1e-12:
                best = (end, ready_at, s)
        assert best is not None
        finish[node], start[node], where[node] = best
        free[best[2]] = best[0]
    return where, start, max(finish.values(), default=0.0)


def fixed_makespan(
    nodes: Sequence[torch.fx.Node],
    cost: dict[torch.fx.Node, float],
    where: dict[torch.fx.Node, int],
) -> float:
    """Predicted time of ``nodes`` with a fixed assignment (node -> stream, missing: main), each
    stream running its nodes in graph order, an input from another stream costing a sync."""
    free: dict[int, float] = {}
    finish: dict[torch.fx.Node, float] = {}
    for node in nodes:
        s = where.get(node, 0)
        ready = free.get(s, 0.0)
        for arg in node.all_input_nodes:
            if arg in finish:
                sync = SYNC_SECONDS if where.get(arg, 0) != s else 0.0
                ready = max(ready, finish[arg] + sync)
        finish[node] = ready + cost[node]
        free[s] = finish[node]
    return max(finish.values(), default=0.0)


def _reorder(gm: torch.fx.GraphModule, start: dict[torch.fx.Node, float]) -> None:
    """Put the calls in order of predicted start (ties: original order); each stream runs its
    nodes in graph order, so this is what lets the schedule happen."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr")]
    if not nodes:
        return
    index = {n: i for i, n in enumerate(nodes)}
    ordered = sorted(nodes, key=lambda n: (start.get(n, 0.0), index[n]))
    anchor = nodes[0].prev
    for node in ordered:
        anchor.append(node)
        anchor = node
    gm.graph.lint()


def _pinned(node: torch.fx.Node) -> bool:
    # getitem runs with its producer; mutations keep their place on main (they end the graph).
    return node.target is operator.getitem or effects(node).mutates


def _order_matters(node: torch.fx.Node) -> bool:
    return effects(node).ordered


def auto_streams(
    max_streams: int = 2, cost_model: str = "flops", min_gain: float = 1.1, max_tokens: int = 256
) -> Any:
    """A pass assigning streams by structure, then list scheduling; see the module docstring."""
    if cost_model not in ("flops", "profile"):
        raise ValueError(
            f"auto_streams: cost_model must be 'flops' or 'profile', got {cost_model!r}"
        )
    if max_streams < 1:
        raise ValueError(f"auto_streams: max_streams must be >= 1, got {max_streams}")
    if max_tokens < 1:
        raise ValueError(f"auto_streams: max_tokens must be >= 1, got {max_tokens}")
    if cost_model == "flops":
        require("auto-streams")
    model: CostModel = flops_cost if cost_model == "flops" else profile_cost

    def auto_streams_pass(gm: torch.fx.GraphModule, inputs: Sequence[Any], cfg: Any) -> None:
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        if any(is_air_op(n.target) for n in calls):
            log.info("auto_streams: the graph already has stream markers; left alone")
            return
        cost = {n: (0.0 if _pinned(n) else model(n)) for n in calls}
        single = sum(cost.values())
        declined = ""
        branches = shared_experts(calls) if max_streams > 1 else []
        if branches:
            tokens = max(b.tokens for b in branches)
            placed = [n for b in branches for n in b.nodes]
            on_side = dict.fromkeys(placed, 1)
            predicted = fixed_makespan(calls, cost, on_side) + SIDE_STREAM_SECONDS
            what = f"shared expert beside routing x{len(branches)}"
            if tokens > max_tokens:
                declined = f"{what} not placed: {tokens} tokens > max_tokens={max_tokens}"
            elif single / max(predicted, 1e-12) < min_gain:
                gain = single / max(predicted, 1e-12)
                declined = f"{what} not placed: predicted gain {gain:.2f}x < min_gain={min_gain}"
            else:
                how = f"{what}, {len(placed)} nodes on auto_shared"
                decision = AutoStreamsDecision(single, predicted, 2, True, pattern=how)
                gm.meta["airstream_auto_streams"] = decision
                log.info("%s", decision)
                place_on_stream(gm, placed, "auto_shared")
                return
        # Reordering is safe unless order itself carries meaning: mutation and RNG order.
        movable = not any(_order_matters(n) for n in calls)
        where, start, makespan = schedule(calls, cost, max_streams, by_rank=movable)
        for node in calls:  # pinned nodes follow their producer (or main)
            if _pinned(node):
                producer = node.args[0] if node.target is operator.getitem else None
                where[node] = where.get(producer, 0) if producer is not None else 0
        used = sorted({s for s in where.values()})
        predicted = makespan + SIDE_STREAM_SECONDS * (len(used) - 1)
        applied = len(used) > 1 and single / max(predicted, 1e-12) >= min_gain
        decision = AutoStreamsDecision(
            single, predicted if len(used) > 1 else single, len(used), applied, declined=declined
        )
        gm.meta["airstream_auto_streams"] = decision
        log.info("%s", decision)
        if not applied:
            return
        if movable:
            _reorder(gm, start)
        for s in used:
            if s != 0:
                place_on_stream(gm, [n for n in calls if where[n] == s], f"auto_{s}")

    return auto_streams_pass
