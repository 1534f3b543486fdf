"""The serial reference executor: generated code without air ops, graph-order semantics."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream.examples.guide import Model, custom_pre_pass
from airstream.graph.streams import assign_streams
from airstream.runtime.serial import SerialExecutor
from airstream.schedule.plan import build_plan

air = torch.ops.air
aten = torch.ops.aten


def _air_count(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "air"
    )


def test_executor_runs_generated_code_without_air_ops() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    config.debug.run_eagerly = True
    compiled, backend = compile_model(Model(), config)
    compiled(torch.randn(3, 3))
    graph = graph_of(backend, "inference")
    executor = graph.executor
    assert isinstance(executor, SerialExecutor)
    assert isinstance(executor.module, torch.fx.GraphModule), "FX-generated code, no Interpreter"
    assert _air_count(graph.graph_module) == 4 and _air_count(executor.module) == 0
    assert "torch.ops.air" not in executor.code and "aten.mm.default" in executor.code
    x = torch.randn(3, 3)
    assert_same(executor([x]), Model()(x))


def _wait_tensor_and_token(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """Make add's input go through wait_tensor(abs, mm) and return a record token unused."""
    g = gm.graph
    abs_node = next(n for n in g.nodes if n.target is aten.abs.default)
    mm = next(n for n in g.nodes if n.target is aten.mm.default)
    with g.inserting_after(abs_node):
        waited = g.call_function(air.wait_tensor.default, (abs_node, mm))
    abs_node.replace_all_uses_with(waited, delete_user_cb=lambda user: user is not waited)
    with g.inserting_after(waited):
        g.call_function(air.record.default, ())


def test_wait_tensor_becomes_identity_and_unused_token_is_dropped() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _wait_tensor_and_token
    config.debug.run_eagerly = True
    compiled, backend = compile_model(Model(), config)
    x = torch.randn(4, 4)
    assert_same(compiled(x), Model()(x))
    graph = graph_of(backend, "inference")
    assert _air_count(graph.graph_module) == 2
    assert _air_count(graph.executor.module) == 0


def test_record_token_returned_from_graph_is_kept() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, air.record()

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(2))
    executor = SerialExecutor(gm, build_plan(gm, assign_streams(gm)))
    out, token = executor([torch.ones(2)])
    assert_same(out, torch.full((2,), 2.0))
    assert isinstance(token, torch.Tensor) and token.numel() == 0


def test_run_eagerly_option_matches_eager_over_many_calls() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    config.debug.run_eagerly = True
    compiled, _ = compile_model(Model(), config)
    for i in range(20):
        x = torch.randn(6, 6, generator=torch.Generator().manual_seed(i))
        assert_same(compiled(x), Model()(x))


class _Gather(torch.nn.Module):
    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x.sin()[index] + 1


def test_op_error_reaches_caller_with_its_type_and_next_call_works() -> None:
    compiled, _ = compile_model(_Gather())
    x = torch.randn(4)
    good = torch.tensor([0, 3])
    assert_same(compiled(x, good), _Gather()(x, good))
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(x, torch.tensor([0, 9]))
    assert_same(compiled(x, good), _Gather()(x, good))
