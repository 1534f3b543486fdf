"""Which runs of a plan may overlap another stream's (schedule/overlap.py), against a brute-force
check of the plan's order: a run overlaps another stream iff neither is ordered before the other."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from tests.test_plan import _enter, _plan

from airstream.schedule import overlap
from airstream.schedule.overlap import overlapping_runs, uses_threads
from airstream.schedule.plan import Record, Run, StreamPlan, Wait

air = torch.ops.air


def _before(plan: StreamPlan) -> set[tuple[torch.fx.Node, torch.fx.Node]]:
    """Every (a, b) of runs with a ordered before b, by transitive closure over the plan."""
    edges: dict[tuple[Any, int], set[tuple[Any, int]]] = {}
    recorded: dict[int, tuple[Any, int]] = {}
    for program in plan.streams:
        for i, step in enumerate(program.steps):
            if i:
                edges.setdefault((program.label, i - 1), set()).add((program.label, i))
            if isinstance(step, Record):
                recorded[step.event] = (program.label, i)
    for program in plan.streams:
        for i, step in enumerate(program.steps):
            if isinstance(step, Wait):
                edges.setdefault(recorded[step.event], set()).add((program.label, i))
    node_at = {
        (p.label, i): s.node
        for p in plan.streams
        for i, s in enumerate(p.steps)
        if isinstance(s, Run)
    }
    out = set()
    for start in node_at:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        out |= {(node_at[start], node_at[s]) for s in seen if s in node_at}
    return out


def _brute(plan: StreamPlan) -> frozenset[torch.fx.Node]:
    before = _before(plan)
    stream_of = {n: s for n, s in plan.stream_of().items() if uses_threads(n)}
    return frozenset(
        a
        for a, b in itertools.permutations(stream_of, 2)
        if stream_of[a] != stream_of[b] and (a, b) not in before and (b, a) not in before
    )


def _fork_join(x: torch.Tensor) -> torch.Tensor:
    a = x.sin()  # alone: before the fork
    _enter("side")
    b = x.cos().exp()  # the side stream
    air.scope_exit()
    c = x.tanh().neg()  # beside the side stream
    d = (b + c).abs() + a  # after the join: alone
    return d.relu()


def test_a_fork_and_join_overlap_only_between_them() -> None:
    _, plan = _plan(_fork_join, torch.randn(256, 256))  # big enough for threads to matter
    overlapping = overlapping_runs(plan)
    assert overlapping == _brute(plan)
    names = {n.name for n in overlapping}
    assert {"cos", "exp", "tanh", "neg"} <= names
    assert not names & {"add", "abs_1", "relu"}  # after the join


def _two_windows(x: torch.Tensor) -> torch.Tensor:
    _enter("side")
    a = x.cos()
    air.scope_exit()
    b = x.sin() + a  # joins the side stream
    c = b.exp()  # alone: the side stream waits for b before its next work
    _enter("side")
    d = b.tanh()
    air.scope_exit()
    e = c.neg()
    return (d * e).relu()


def test_two_windows_and_the_alone_run_between_them() -> None:
    _, plan = _plan(_two_windows, torch.randn(256, 256))
    overlapping = overlapping_runs(plan)
    assert overlapping == _brute(plan)
    # exp and neg come after the record the side stream's second window waits for
    assert {n.name for n in overlapping} == {"cos", "sin", "tanh", "exp", "neg"}
    assert "add" not in {n.name for n in overlapping}  # between the windows: alone


def test_small_ops_and_views_are_not_work_to_overlap() -> None:
    _, plan = _plan(_fork_join, torch.randn(4))
    assert overlapping_runs(plan) == frozenset()  # 4 elements: no op's threads matter

    def transposed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        _enter("side")
        t = w.t()  # a view: no work, however big
        air.scope_exit()
        return (x @ w).relu() + t.sum()

    _, plan = _plan(transposed, torch.randn(8, 256), torch.randn(256, 256))
    assert overlapping_runs(plan) == frozenset()


def test_random_programs_agree_with_the_brute_force_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(overlap, "THREADED_NUMEL", 0)  # the fuzzer's tensors are small
    import random

    from airstream.graph.streams import assign_streams
    from airstream.schedule.plan import build_plan
    from airstream.selftest.fuzz import draw_program, trace_program

    rng = random.Random(0)
    checked = 0
    for _ in range(40):
        gm = trace_program(draw_program(rng))
        plan = build_plan(gm, assign_streams(gm))
        assert overlapping_runs(plan) == _brute(plan)
        checked += len(plan.side_streams) > 0
    assert checked >= 20  # most programs have side streams


def test_one_stream_overlaps_nothing() -> None:
    _, plan = _plan(lambda x: x.sin().cos(), torch.randn(4))
    assert overlapping_runs(plan) == frozenset()
