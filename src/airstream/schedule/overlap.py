"""Which steps of a plan may run while another stream works: the others run alone.

A run step on stream A *overlaps* a run step on stream B when neither is ordered before the other
by the plan (each stream's order, and every wait after the record it names); only ops that work
count (:func:`uses_threads`: not views, not ops on a few elements). A step that overlaps none
runs alone: no other stream can be computing then, so the runtime gives it every intra-op
thread the caller has (``runtime/cpu.py``) and max-autotune compiles its segment's kernels for
them (``schedule/fuse.py``); a step that may overlap another runs on its stream's
``threads_per_stream``. The answer depends on the plan alone, not on timings, so every call of a
compiled graph uses the same threads for the same op.

The planner's vector clocks (``StreamPlan.known``): a run's clock holds, for every stream, the
index of the last run known complete before it starts. Run ``s`` (stream A, run i) and run ``t``
(stream B, run j) are ordered when ``clock(s)[B] >= j`` or ``clock(t)[A] >= i``. Along B the
clocks only grow, so checking the first working run of B not known complete before ``s``
decides for all of B.
"""

from __future__ import annotations

import bisect
import operator

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.schedule.plan import StreamPlan

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
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    found = effects(node)
    if found.caller_threads:  # it must get the caller's threads (airstream.graph.foreign_ops)
        return True
    if found.view:
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
    if sum(1 for s in plan.streams if s.runs) < 2:
        return frozenset()
    known = plan.known
    # per stream: the runs that work, each with its index among the stream's runs
    working = {
        s.label: [(i, n) for i, n in enumerate(s.runs) if uses_threads(n)] for s in plan.streams
    }
    indices = {label: [i for i, _ in runs] for label, runs in working.items()}
    out: set[torch.fx.Node] = set()
    for label, runs in working.items():
        for i, node in runs:
            seen = known[node]
            for stream, theirs in working.items():
                if stream == label or not theirs:
                    continue
                # the first working run of `stream` not known complete before this one
                first = bisect.bisect_right(indices[stream], seen.get(stream, -1))
                if first < len(theirs) and known[theirs[first][1]].get(label, -1) < i:
                    out.add(node)  # that run neither precedes nor follows this one
                    break
    return frozenset(out)
