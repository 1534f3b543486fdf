"""Predicted time of a graph on streams: list scheduling and the simulation of a fixed plan.

Both use one machine's figures (:class:`airstream.machine.calibration.MachineCosts`): a sync costs
``sync_seconds``. An op's time is its work (its cost beyond dispatch: a matrix multiply's, a
custom op's, any kernel's) and its host part (dispatch). Work on a side stream, or on the main
stream while another stream works beside it, takes ``thread_slowdown`` times its one-stream time
(it runs on one intra-op thread; the runtime gives the main stream every thread back where it
runs alone: ``schedule/overlap.py``). Each part also takes longer for the time another stream
works beside it, by the measured slowdowns of work and host parts beside each other (the larger
of that and the thread slowdown for work; the figures were measured on matrix multiplies).
Overlap here is the simulated timing's, where the runtime's threads follow the plan's order: a
main-stream node the plan lets overlap but the timing does not is priced on every thread. The
side streams' fixed per-call cost is added by the caller, once per stream used.

Which syncs a placement needs is the planner's answer (``pricing.Pricer``: data, mutation, RNG
and collective order, less the waits earlier waits imply), given to :func:`makespan` as
``waits``. The list scheduler, which tries every stream for every node, charges a sync for each
input from another stream instead, as an estimate; its result is then priced by the planner.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx

from airstream.machine.calibration import MachineCosts

__all__ = ["makespan", "schedule"]

Node = torch.fx.Node


def _upward_rank(nodes: Sequence[Node], cost: dict[Node, float]) -> dict[Node, float]:
    """Longest cost path from each node to the end of the graph (HEFT's priority)."""
    rank: dict[Node, float] = {}
    members = set(nodes)
    for node in reversed(nodes):
        after = [rank[u] for u in node.users if u in members]
        rank[node] = cost[node] + (max(after) if after else 0.0)
    return rank


def _rank_order(nodes: Sequence[Node], cost: dict[Node, float]) -> list[Node]:
    """A topological order taking the ready node of highest upward rank first."""
    rank = _upward_rank(nodes, cost)
    return ordered_by(nodes, lambda n: -rank[n])


def ordered_by(nodes: Sequence[Node], priority: Callable[[Node], float]) -> list[Node]:
    """A topological order of ``nodes`` (inputs among them first) taking, of the nodes ready,
    the one of lowest ``priority`` first (ties: the order given)."""
    members = set(nodes)
    index = {n: i for i, n in enumerate(nodes)}
    waiting = {n: sum(1 for a in n.all_input_nodes if a in members) for n in nodes}
    ready = [(priority(n), index[n]) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        node = nodes[heapq.heappop(ready)[1]]
        order.append(node)
        for user in node.users:
            if user in members:
                waiting[user] -= 1
                if waiting[user] == 0:
                    heapq.heappush(ready, (priority(user), index[user]))
    return order


def _times(
    order: Sequence[Node],
    cost: dict[Node, float],
    where: dict[Node, int],
    sync: float,
    waits: Mapping[Node, Sequence[Node]] | None = None,
) -> dict[Node, tuple[float, float]]:
    """Start and finish of each node, each stream running its nodes in ``order``: after the
    nodes ``waits`` names (each a sync), else after every input from another stream."""
    free: dict[int, float] = {}
    times: dict[Node, tuple[float, float]] = {}
    for node in order:
        s = where.get(node, 0)
        ready = free.get(s, 0.0)
        if waits is not None:
            for producer in waits.get(node, ()):
                if producer in times:
                    ready = max(ready, times[producer][1] + sync)
        else:
            for arg in node.all_input_nodes:
                if arg in times:
                    ready = max(ready, times[arg][1] + (sync if where.get(arg, 0) != s else 0.0))
        times[node] = (ready, ready + cost[node])
        free[s] = ready + cost[node]
    return times


def _beside(
    busy: list[tuple[float, float, float]], starts: list[float], start: float, end: float
) -> tuple[float, float]:
    """Time within ``[start, end]`` that a stream spends multiplying matrices and on host work
    (dispatch, small ops), from its nodes' ``(start, end, matrix-multiply share)``, sorted and
    disjoint (a stream runs one node at a time)."""
    matmul = host = 0.0
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    while i < len(busy) and busy[i][0] < end:
        b_start, b_end, share = busy[i]
        overlap = max(0.0, min(end, b_end) - max(start, b_start))
        matmul += overlap * share
        host += overlap * (1.0 - share)
        i += 1
    return matmul, host


def _slowed(
    cost: dict[Node, float],
    where: dict[Node, int],
    times: dict[Node, tuple[float, float]],
    costs: MachineCosts,
) -> dict[Node, float]:
    """Costs stretched for what other streams do beside each node. A node's time is work (its
    cost beyond dispatch: the kernel reading, writing and computing, whatever op it is; a
    matrix multiply's, a custom op's) and host work (dispatch); each part is slowed by the
    measured slowdown for the share of time another stream spends on each kind beside it: work
    beside work (memory bandwidth and cores; measured on matrix multiplies), work beside host
    work (on one core: the core), host beside host (the GIL)."""
    matmul = {n: max(c - costs.dispatch_seconds, 0.0) for n, c in cost.items()}
    busy: dict[int, list[tuple[float, float, float]]] = {}
    for node, (start, end) in times.items():
        if end > start and cost[node] > 0:
            share = matmul[node] / cost[node]
            busy.setdefault(where.get(node, 0), []).append((start, end, share))
    for intervals in busy.values():
        intervals.sort()
    starts = {s: [iv[0] for iv in ivs] for s, ivs in busy.items()}
    slowed = dict(cost)
    for node, (start, end) in times.items():
        if end <= start:
            continue
        mine = where.get(node, 0)
        m_beside = h_beside = 0.0
        for s, ivs in busy.items():
            if s != mine:
                m, h = _beside(ivs, starts[s], start, end)
                m_beside, h_beside = m_beside + m, h_beside + h
        # one thread on a side stream, and on the main stream beside another stream's work
        thread = costs.thread_slowdown if mine != 0 or m_beside + h_beside > 0 else 1.0
        m_frac = min(m_beside / (end - start), 1.0)
        h_frac = min(h_beside / (end - start), 1.0 - m_frac)
        host = cost[node] - matmul[node]
        beside = (
            1.0 + (costs.overlap_slowdown - 1.0) * m_frac + (costs.mixed_slowdown - 1.0) * h_frac
        )
        slowed[node] = (
            host
            + matmul[node] * max(thread, beside)
            + host * ((costs.mixed_slowdown - 1.0) * m_frac + (costs.host_slowdown - 1.0) * h_frac)
        )
    return slowed


def _threaded(
    cost: dict[Node, float], where: dict[Node, int], costs: MachineCosts
) -> dict[Node, float]:
    """Costs on more than one stream before any overlap is known: a side stream's work on one
    thread (the main stream's are charged once they overlap, in ``_slowed``)."""
    if costs.thread_slowdown <= 1.0:
        return cost
    return {
        n: c + (max(c - costs.dispatch_seconds, 0.0) * (costs.thread_slowdown - 1.0))
        if where.get(n, 0) != 0
        else c
        for n, c in cost.items()
    }


def makespan(
    order: Sequence[Node],
    cost: dict[Node, float],
    where: dict[Node, int],
    costs: MachineCosts,
    waits: Mapping[Node, Sequence[Node]] | None = None,
) -> float:
    """Predicted time of ``order`` with a fixed assignment (node -> stream; missing: main), each
    stream running its nodes in ``order``; ``waits``: the syncs the planner adds for it
    (``pricing.Pricer.waits``; None: one per input from another stream)."""
    sync = costs.sync_seconds
    streams = len({where.get(n, 0) for n in order})
    times = _times(
        order, _threaded(cost, where, costs) if streams > 1 else cost, where, sync, waits
    )
    slowdowns = (
        costs.overlap_slowdown,
        costs.mixed_slowdown,
        costs.host_slowdown,
        costs.thread_slowdown,
    )
    if max(slowdowns) > 1.0 and streams > 1:
        for _ in range(2):  # the stretched plan overlaps differently: settle once more
            times = _times(order, _slowed(cost, where, times, costs), where, sync, waits)
    return max((t[1] for t in times.values()), default=0.0)


def schedule(
    nodes: Sequence[Node],
    cost: dict[Node, float],
    max_streams: int,
    costs: MachineCosts,
    by_rank: bool = False,
) -> tuple[dict[Node, int], dict[Node, float]]:
    """List scheduling: each node, when ready, to the stream finishing it first.

    ``by_rank``: nodes are taken in order of upward rank (HEFT), else in graph order. Returns
    node -> stream (0 = main) and node -> predicted start; :func:`makespan` of the nodes in
    order of start is the prediction (each stream runs its nodes in that order)."""
    order = _rank_order(nodes, cost) if by_rank else list(nodes)
    free = [0.0] * max_streams
    finish: dict[Node, float] = {}
    start: dict[Node, float] = {}
    where: dict[Node, int] = {}
    for node in order:
        best: tuple[float, float, int] | None = None
        for s in range(max_streams):
            ready_at = free[s]
            for arg in node.all_input_nodes:
                if arg in finish:
                    sync = costs.sync_seconds if where[arg] != s else 0.0
                    ready_at = max(ready_at, finish[arg] + sync)
            end = ready_at + cost[node]
            if best is None or end < best[0] - 1e-12:
                best = (end, ready_at, s)
        assert best is not None
        finish[node], start[node], where[node] = best
        free[best[2]] = best[0]
    return where, start
