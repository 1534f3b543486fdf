"""``passes.auto_streams()``: streams without labels, by graph structure and list scheduling.

Every figure comes from the machine (``airstream.machine.calibration``: measured once per machine
and torch, or nominal): each op's cost (``cost.py``), the cost of a side stream and of a sync, and
how much slower work runs beside another stream (``simulate.py``).

First, roles that serving stacks place on side streams by hand are looked for by structure
(``patterns.py``): a shared expert beside the routed experts of a MoE block, and parallel
projections (Q/K/V, MLA's query and key/value paths, an MLP's gate and up). Those whose matrix
multiplies see at most ``max_tokens`` rows (side streams pay in decode, not in long prefills) and
that shorten the predicted time are placed (``roles.py``), each role on one stream reused by
every layer, when the whole prediction gains at least ``min_gain``. Otherwise the general list
scheduler below decides.

Each op in turn goes to the stream where it would finish first, given when each stream is free
and when its inputs are ready (an input from another stream adds the cost of a sync). Ops are
taken in graph order; when nothing in the graph depends on order (no mutation, no RNG op) they
are taken by upward rank instead (HEFT: longest remaining path first) and the graph is reordered
by predicted start time, since each stream runs its ops in graph order. The predicted time, plus
the fixed cost of every side stream used, is compared with running everything on one stream;
below ``min_gain`` the graph is left single-stream, so the pass never makes a model slower by
its own estimate. Graphs that already
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

import dataclasses
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.nodes import AUTO_STREAMS_KEY
from airstream.machine.calibration import MachineCosts, machine_costs, measures_costs
from airstream.ops.library import is_air_op
from airstream.passes.auto.candidates import (
    LIST_SCHEDULE,
    ORDER_KEY,
    SHARED_EXPERTS,
    Candidate,
    balanced_branches,
    measured_here,
    record_alternatives,
    shared_experts_beside,
)
from airstream.passes.auto.cost import CostModel, flops_cost, profile_cost
from airstream.passes.auto.pricing import Pricer
from airstream.passes.auto.roles import find_roles, place_roles
from airstream.passes.auto.simulate import makespan, schedule
from airstream.passes.toolkit import place_on_stream
from airstream.torch_internals import require

__all__ = ["AutoStreamsDecision", "auto_streams"]

log = logging.getLogger("airstream.passes")

_TIE = 0.01  # predictions within 1% are a tie: the roles' placement is kept
# where the first calls will measure, a placement priced at least this close to one stream is
# proposed though under min_gain: the table's error on this machine is larger than the gap
_PROPOSE = 0.95


@dataclass(frozen=True)
class AutoStreamsDecision:
    """What auto_streams predicted and did."""

    single_stream_seconds: float
    multi_stream_seconds: float
    streams_used: int
    applied: bool
    pattern: str = ""  # the structural roles placed, if any were
    declined: str = ""  # why structural roles found were not placed
    costs: str = "nominal"  # whose figures: "nominal" or "measured <when>"
    # the other placements kept for measure_placement to time, with their predicted gains
    alternatives: tuple[str, ...] = ()

    @property
    def predicted_gain(self) -> float:
        """Single-stream time over the plan's predicted time."""
        return self.single_stream_seconds / max(self.multi_stream_seconds, 1e-12)

    def __str__(self) -> str:
        verdict = "applied" if self.applied else "kept single stream"
        how = f" ({self.pattern})" if self.pattern else ""
        declined = f"; {self.declined}" if self.declined else ""
        others = f"; alternatives to measure: {', '.join(self.alternatives)}"
        return (
            f"auto_streams: predicted {self.single_stream_seconds * 1e3:.3f} ms on one stream, "
            f"{self.multi_stream_seconds * 1e3:.3f} ms on {self.streams_used} "
            f"(gain {self.predicted_gain:.2f}x, {self.costs} costs): {verdict}{how}{declined}"
            f"{others if self.alternatives else ''}"
        )


def _reorder(gm: torch.fx.GraphModule, start: dict[torch.fx.Node, float]) -> None:
    """Put the calls in order of predicted start (ties: original order); each stream runs its
    nodes in graph order, so this is what lets the schedule happen."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr")]
    if not nodes:
        return
    index = {n: i for i, n in enumerate(nodes)}
    for node, i in index.items():  # the alternatives measured beside it run in this order
        node.meta[ORDER_KEY] = i
    ordered = sorted(nodes, key=lambda n: (start.get(n, 0.0), index[n]))
    anchor = nodes[0].prev
    for node in ordered:
        anchor.append(node)
        anchor = node
    gm.graph.lint()


def _propose(
    gm: torch.fx.GraphModule,
    calls: Sequence[torch.fx.Node],
    declined: AutoStreamsDecision,
    proposals: Sequence[Candidate],
    most: int,
    listing: Candidate,
) -> None:
    """Apply the best-priced proposal for measure_placement to time against one stream (and
    the others, as alternatives), though the cost table priced it under ``min_gain``."""
    # the shared experts first (serving stacks place them by hand, and the table prices their
    # overlap with routing worst), else the best priced
    best = (
        proposals[0]
        if proposals[0].name == SHARED_EXPERTS
        else min(proposals, key=lambda c: c.predicted)
    )
    single = declined.single_stream_seconds
    others = [c for c in (*proposals, listing) if c is not best and c.where]
    gain = single / max(best.predicted, 1e-12)
    decision = dataclasses.replace(
        declined,
        multi_stream_seconds=best.predicted,
        streams_used=1 + len(best.labels),
        applied=True,
        pattern=f"{best.name}, to be measured (predicted {gain:.2f}x, under min_gain)",
        alternatives=_alternatives(gm, single, others, most),
    )
    gm.meta[AUTO_STREAMS_KEY] = decision
    log.info("%s", decision)
    for index, label in best.labels.items():
        place_on_stream(gm, [n for n in calls if best.where.get(n) == index], label)


def _alternatives(
    gm: torch.fx.GraphModule, single: float, others: Sequence[Candidate], most: int
) -> tuple[str, ...]:
    """Record the other placements worth measuring (candidates.py); each in words."""
    names = record_alternatives(gm, single, others, most)
    predicted = {c.name: c.predicted for c in others}
    return tuple(
        f"{name} (predicted {single / max(predicted[name], 1e-12):.2f}x)" for name in names
    )


def _pinned(node: torch.fx.Node) -> bool:
    # getitem runs with its producer; mutations keep their place on main (they end the graph);
    # an op needing the caller's threads runs on main (airstream.graph.foreign_ops).
    found = effects(node)
    return node.target is operator.getitem or found.mutates or found.caller_threads


def _order_matters(node: torch.fx.Node) -> bool:
    return effects(node).ordered


def auto_streams(
    max_streams: int = 2,
    cost_model: str = "flops",
    min_gain: float = 1.05,
    max_tokens: int = 256,
    costs: str | MachineCosts | None = None,
    alternatives: int = 1,
) -> Any:
    """A pass assigning streams by structure, then list scheduling; see the module docstring.

    ``alternatives``: how many other placements (the roles, the list schedule, balanced
    branches; ``candidates.py``) to propose beside the one applied, for
    ``stream_config.measure_placement`` to time against it; each costs a compile.

    ``costs``: the machine's figures (``airstream.machine.calibration``): ``"measured"`` (on this
    machine, cached), ``"nominal"``, a :class:`MachineCosts`, or None for ``$AIRSTREAM_COSTS``
    (default ``"measured"``). They are read when the pass first runs."""
    if cost_model not in ("flops", "profile"):
        raise ValueError(
            f"auto_streams: cost_model must be 'flops' or 'profile', got {cost_model!r}"
        )
    if max_streams < 1:
        raise ValueError(f"auto_streams: max_streams must be >= 1, got {max_streams}")
    if alternatives < 0:
        raise ValueError(f"auto_streams: alternatives must be >= 0, got {alternatives}")
    if max_tokens < 1:
        raise ValueError(f"auto_streams: max_tokens must be >= 1, got {max_tokens}")
    if isinstance(costs, str) and costs not in ("measured", "nominal"):
        raise ValueError(
            f"auto_streams: costs must be 'measured', 'nominal' or a MachineCosts, got {costs!r}"
        )
    if cost_model == "flops":
        require("auto-streams")
    model: CostModel = flops_cost if cost_model == "flops" else profile_cost

    def auto_streams_pass(gm: torch.fx.GraphModule, inputs: Sequence[Any], cfg: Any) -> None:
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        if any(is_air_op(n.target) for n in calls):
            log.info("auto_streams: the graph already has stream markers; left alone")
            return
        figures = costs if isinstance(costs, MachineCosts) else machine_costs(costs)
        stream_config = getattr(cfg, "stream_config", None)  # None: a pass called by hand
        threads = getattr(stream_config, "threads_per_stream", 1)
        figures = figures.with_stream_threads(threads, torch.get_num_threads())
        cost = {n: (0.0 if _pinned(n) else model(n, figures)) for n in calls}
        single = sum(cost.values())
        roles = find_roles(calls) if max_streams > 1 else []
        pricer = Pricer(gm)
        placed = place_roles(calls, cost, roles, figures, max_streams, max_tokens, pricer)
        declined = placed.declined(max_tokens)
        # The list schedule, for comparison: reordering is safe unless order itself carries
        # meaning (mutation and RNG order).
        movable = not any(_order_matters(n) for n in calls)
        where, start = schedule(calls, cost, max_streams, figures, by_rank=movable)
        for node in calls:  # pinned nodes follow their producer (or main)
            if _pinned(node):
                producer = node.args[0] if node.target is operator.getitem else None
                where[node] = where.get(producer, 0) if producer is not None else 0
        used = sorted({s for s in where.values()})
        runs = sorted(calls, key=lambda n: start[n]) if movable else calls
        if len(used) > 1:
            listed = makespan(runs, cost, where, figures, pricer.waits(where))
        else:
            listed = single
        listed += figures.side_stream_seconds * (len(used) - 1)
        # the roles' placement (named, in graph order) unless the list schedule beats it by
        # more than the model's rounding
        listing = Candidate(
            LIST_SCHEDULE,
            {n: s for n, s in where.items() if s != 0},
            {s: f"auto_{s}" for s in used if s != 0},
            listed,
        )
        roles_placed = Candidate("roles", placed.where, placed.labels, placed.predicted)
        branches = balanced_branches(calls, cost, roles, figures, max_streams, max_tokens, pricer)
        if placed.placed and placed.predicted <= listed * (1 + _TIE):
            gain = single / max(placed.predicted, 1e-12)
            if gain >= min_gain:
                others = [c for c in (listing, branches) if c is not None and c.where]
                decision = AutoStreamsDecision(
                    single,
                    placed.predicted,
                    1 + len(placed.labels),
                    True,
                    pattern=placed.describe(),
                    declined=declined,
                    costs=figures.source,
                    alternatives=_alternatives(gm, single, others, alternatives),
                )
                gm.meta[AUTO_STREAMS_KEY] = decision
                log.info("%s", decision)
                for index, label in placed.labels.items():
                    place_on_stream(gm, [n for n in calls if placed.where.get(n) == index], label)
                return
            why = f"not placed: predicted {gain:.2f}x < min_gain={min_gain}"
            declined = f"{placed.describe()} {why}" + (f"; {declined}" if declined else "")
        elif placed.placed:
            why = (
                f"not placed: predicted {single / max(placed.predicted, 1e-12):.2f}x, the list "
                f"schedule {single / max(listed, 1e-12):.2f}x"
            )
            declined = f"{placed.describe()} {why}" + (f"; {declined}" if declined else "")
        applied = len(used) > 1 and single / max(listed, 1e-12) >= min_gain
        others = [c for c in (roles_placed, branches) if c is not None and c.where]
        decision = AutoStreamsDecision(
            single,
            listed,
            len(used),
            applied,
            declined=declined,
            costs=figures.source,
            alternatives=_alternatives(gm, single, others, alternatives) if applied else (),
        )
        if not applied and measured_here(gm, cfg):
            # the cost table declines, and the first calls will measure: the placement it
            # prices best is proposed anyway, and kept only where it measures faster
            shared = shared_experts_beside(calls, cost, roles, figures, max_tokens, pricer)
            proposals = [c for c in (shared, roles_placed, branches) if c is not None and c.where]
            proposals = [c for c in proposals if single / max(c.predicted, 1e-12) >= _PROPOSE]
            if proposals:
                _propose(gm, calls, decision, proposals, alternatives, listing)
                return
        gm.meta[AUTO_STREAMS_KEY] = decision
        log.info("%s", decision)
        if not applied:
            return
        if movable:
            _reorder(gm, start)
        for s in used:
            if s != 0:
                place_on_stream(gm, [n for n in calls if where[n] == s], f"auto_{s}")

    if not isinstance(costs, MachineCosts):
        measures_costs(auto_streams_pass, costs)
    return auto_streams_pass
