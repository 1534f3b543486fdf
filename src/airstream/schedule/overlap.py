"""Which steps of a plan may run while another stream works: the others run alone.

A run step on stream A *overlaps* a run step on stream B when neither is ordered before the other
by the plan (each stream's order, and every wait after the record it names); only ops that work
count (:func:`uses_threads`: not views, not ops on a few elements). A step that overlaps none
runs alone: no other stream can be computing then, so the runtime gives it every intra-op
thread the caller has (``runtime/cpu.py``) and max-autotune compiles its segment's kernels for
them (``schedule/fuse.py``); a step that may overlap another runs on its stream's
``threads_per_stream``. The answer depends on the plan alone, not on timings, so every call of a
compiled graph uses the same threads for the same op.

Vector clocks over ``StreamPlan.sequence`` (an order where each record comes before its waits):
a step's clock holds, for every stream, the position of the last step known complete before it.
Run ``s`` (stream A, position i) and run ``t`` (stream B, position j) are ordered when
``clock(s)[B] >= j`` or ``clock(t)[A] >= i``. Along B the clocks only grow, so checking the first
run of B not known complete before ``s`` decides for all of B.
"""

from __future__ import annotations

import bisect
import operator

import torch
import torch.fx

from airstream.effects import effects
from airstream.schedule.plan import Record, Run, StreamPlan, Wait

__all__ = ["THREADED_NUMEL", "overlapping_runs", "uses_threads"]

# ATen runs an op on more than one intra-op thread only from this many elements on
# (at::internal::GRAIN_SIZE); MKL's matrix multiplies split by similar sizes.
THREADED_NUMEL = 32768


def uses_threads(node: torch.fx.Node) -> bool:
    """Whether ``node``'s op is big enough for intra-op threads to matter: it computes (not a
    view, not a tuple's element) and a tensor it makes or reads has at least ``THREADED_NUMEL``
    elements (a symbolic size counts as big). Smaller ops (a router's top-k over a few tokens)
    and views (a weight's transpose) take a core for microseconds: running beside one is not
    sharing the cores."""
    if node.op != "call_function" or node.target is operator.getitem or effects(node).view:
        return False
    values = [node.meta.get("val")] + [n.meta.get("val") for n in node.all_input_nodes]
    for value in values:
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, torch.Tensor):
                numel = item.numel()
                if not isinstance(numel, int) or numel >= THREADED_NUMEL:
                    return True
    return False


def overlapping_runs(plan: StreamPlan) -> frozenset[torch.fx.Node]:
    """The nodes of ``plan`` whose run may overlap a run on another stream that does work
    (:func:`uses_threads`)."""
    labels = [s.label for s in plan.streams]
    if sum(1 for s in plan.streams if s.runs) < 2:
        return frozenset()
    index = {label: k for k, label in enumerate(labels)}
    clock = {label: [-1] * len(labels) for label in labels}
    position = dict.fromkeys(labels, -1)
    recorded: dict[int, list[int]] = {}
    # per stream: its runs' positions and clocks, in order
    runs: dict[object, list[tuple[int, tuple[int, ...], torch.fx.Node]]] = {
        label: [] for label in labels
    }
    for label, step in plan.sequence:
        position[label] += 1
        mine = clock[label]
        mine[index[label]] = position[label]
        if isinstance(step, Wait):
            other = recorded.get(step.event)
            if other is None:
                raise ValueError(f"plan waits for event e{step.event} before it is recorded")
            clock[label] = mine = [max(a, b) for a, b in zip(mine, other, strict=True)]
        elif isinstance(step, Record):
            recorded[step.event] = list(mine)
        elif isinstance(step, Run) and uses_threads(step.node):
            runs[label].append((position[label], tuple(mine), step.node))
    positions = {label: [p for p, _, _ in runs[label]] for label in labels}
    out: set[torch.fx.Node] = set()
    for label in labels:
        a = index[label]
        for i, seen, node in runs[label]:
            for stream in labels:
                if stream == label or not runs[stream]:
                    continue
                known = seen[index[stream]]  # its steps up to here are done before this run
                first = bisect.bisect_right(positions[stream], known)
                if first < len(runs[stream]) and runs[stream][first][1][a] < i:
                    out.add(node)  # that run neither precedes nor follows this one
                    break
    return frozenset(out)
