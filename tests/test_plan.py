"""StreamPlan structure: syncs for data, control, mutation and RNG edges; fewest waits; join."""

from __future__ import annotations

from typing import Any

import torch
from tests.conftest import compile_model, graph_of
from tests.plan_checks import check_requirements, simulate
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream.examples.guide import Model, custom_pre_pass
from airstream.graph.streams import assign_streams
from airstream.schedule.plan import Record, StreamPlan, Wait, build_plan

air = torch.ops.air
LABEL = "_user_stream_label"


def _enter(label: str) -> None:
    air.scope_enter([LABEL], [label])


def _plan(fn: Any, *args: torch.Tensor) -> tuple[torch.fx.GraphModule, StreamPlan]:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    streams = assign_streams(gm)
    plan = build_plan(gm, streams)
    simulate(plan)
    check_requirements(gm, plan, streams)
    return gm, plan


def _reasons(plan: StreamPlan) -> list[tuple[str, str, str]]:
    return [(s.producer.name, s.consumer.name, s.reason) for s in plan.syncs]


def _steps(plan: StreamPlan, label: str | None) -> list[str]:
    return [str(step) for step in plan.stream(label).steps]


def test_design_example_plan() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    compiled, backend = compile_model(Model(), config)
    compiled(torch.randn(4, 4))
    graph = graph_of(backend, "inference")
    plan = graph.plan
    assert _steps(plan, "stream_1") == ["run mm", "run abs_1", "record e0"]
    assert _steps(plan, None) == ["wait e0", "run add", "run sub"]
    # add needs abs_1 (data); the user's wait before sub and sub's data edge from mm are implied
    # by that one wait, and so is the join.
    assert _reasons(plan) == [("abs_1", "add", "data")]
    assert plan.dropped_waits >= 2
    check_requirements(graph.graph_module, plan, graph.streams)
    summary = plan.summary()
    assert "stream_1" in summary and "1 added by the planner" in summary
    assert "e0: abs_1 [stream_1] -> add [main]  (data)" in summary


def test_cross_stream_data_edges_from_two_streams() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = x.sin()
        air.scope_exit()
        _enter("s2")
        b = x.cos()
        air.scope_exit()
        return a + b

    _, plan = _plan(f, torch.randn(3))
    assert sorted(_reasons(plan)) == [("cos", "add", "data"), ("sin", "add", "data")]
    assert plan.stream(None).steps[:2] in ((Wait(0), Wait(1)), (Wait(1), Wait(0)))


def test_wait_implied_through_another_stream_is_dropped() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = x.sin()
        air.scope_exit()
        _enter("s2")
        b = a.cos()  # s2 waits for a
        air.scope_exit()
        c = b.exp()  # main waits for b, and so knows a is done
        return c + a  # needs a: implied, no second wait

    _, plan = _plan(f, torch.randn(3))
    assert _reasons(plan) == [("sin", "cos", "data"), ("cos", "exp", "data")]
    assert sum(isinstance(s, Wait) for s in plan.stream(None).steps) == 1
    assert plan.dropped_waits >= 2  # c + a's edge, and the join on s1 and s2


def test_explicit_record_wait_without_data_edge() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _enter("s1")
        a = x.sin()
        r = air.record()
        air.scope_exit()
        air.wait([r])
        b = x.cos()  # no data edge to a, but ordered after it by the wait
        return a, b

    _, plan = _plan(f, torch.randn(3))
    assert _reasons(plan)[0] == ("sin", "wait", "control")
    main = _steps(plan, None)
    assert main.index("wait e0") < main.index("run cos")


def test_wait_tensor_orders_consumers() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = x.sin()
        air.scope_exit()
        y = air.wait_tensor(x * 2, a)
        return y + 1

    _, plan = _plan(f, torch.randn(3))
    assert ("sin", "wait_tensor", "control") in _reasons(plan)


def test_input_mutation_waits_for_readers_on_other_streams() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = x.sin()  # reads x on s1
        air.scope_exit()
        x.copy_(x * 3)  # writes x on main: after the read on s1
        return a

    _, plan = _plan(f, torch.randn(3))
    assert ("sin", "copy_", "mutation") in _reasons(plan)
    main = _steps(plan, None)
    assert main.index("wait e0") < main.index("run copy_")


def test_rng_ops_keep_graph_order_across_streams() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = torch.rand(3)
        air.scope_exit()
        b = torch.rand(3)
        return x + b + 0 * a.sum()

    _, plan = _plan(f, torch.randn(3))
    assert ("rand", "rand_1", "rng") in _reasons(plan)


def test_join_waits_for_side_work_nobody_reads() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        y.add_(1)  # mutates an input; no one reads the result
        air.scope_exit()
        return x.sin()

    _, plan = _plan(f, torch.randn(3), torch.randn(3))
    assert ("add_", "output", "join") in _reasons(plan)
    assert isinstance(plan.stream(None).steps[-1], Wait)


def test_plan_is_printable_and_frozen() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = x.sin()
        air.scope_exit()
        return a.cos()

    _, plan = _plan(f, torch.randn(3))
    text = str(plan)
    assert "stream main:" in text and "stream s1:" in text and "record e0" in text
    try:
        plan.syncs = ()  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("StreamPlan must be frozen")


def test_checkers_catch_a_missing_wait_and_a_deadlock() -> None:
    import dataclasses

    import pytest

    def f(x: torch.Tensor) -> torch.Tensor:
        _enter("s1")
        a = x.sin()
        air.scope_exit()
        return a.cos()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(3))
    streams = assign_streams(gm)
    plan = build_plan(gm, streams)
    main = plan.stream(None)
    no_wait = dataclasses.replace(
        plan,
        streams=tuple(
            dataclasses.replace(s, steps=tuple(x for x in s.steps if not isinstance(x, Wait)))
            if s is main
            else s
            for s in plan.streams
        ),
    )
    with pytest.raises(AssertionError, match="may start before sin"):
        check_requirements(gm, no_wait, streams)
    no_record = dataclasses.replace(
        plan,
        streams=tuple(
            dataclasses.replace(s, steps=tuple(x for x in s.steps if not isinstance(x, Record)))
            for s in plan.streams
        ),
    )
    with pytest.raises(AssertionError, match="deadlocks"):
        simulate(no_record)


def test_a_long_chain_of_views_plans_without_recursion() -> None:
    """Storage lookups are iterative: thousands of chained views of one input are fine."""
    from airstream.schedule.deps import requirements

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    view = x
    for _ in range(3000):
        view = graph.call_function(aten.slice.Tensor, (view, 0, 0, 4))
    write = graph.call_function(aten.add_.Tensor, (view, 1))
    read = graph.call_function(aten.add.Tensor, (x, 1))
    graph.output((write, read))
    reqs = requirements(graph)
    # the read of x follows the write through 3000 views of it: one storage
    assert any(r.before is write and r.reason == "mutation" for r in reqs[read])
