"""Collectives in one process: torch's fake process group (world size 2, no communication).

Structure of ``overlap_communication`` and the collective-order rules; the numerics over real
ranks are in ``test_distributed.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.conftest import assert_same, cause_of, compile_model, graph_of

import airstream
from airstream import torch_internals

funcol = torch_internals.functional_collectives()
all_reduce = torch_internals.collective_op("all_reduce")


@pytest.fixture
def fake_group() -> Iterator[None]:
    dist.init_process_group("fake", store=torch_internals.fake_store(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    total = funcol.all_reduce(x @ w, "sum", dist.group.WORLD)
    return total.relu() + (x * 2).sin()  # Dynamo's order: the sum's use before the branch


def _names(graph: Any, label: str | None) -> list[str]:
    return list(graph.plan.stream(label).run_names)


def test_overlap_communication_moves_the_collective_and_what_only_it_needs(
    fake_group: None,
) -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.overlap_communication()
    compiled, backend = compile_model(_layer, config, fullgraph=True)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    assert_same(compiled(x, w), _layer(x, w), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert _names(graph, "comm") == ["mm", "all_reduce", "wait_tensor"]
    # main computes the independent branch first, then waits for the sum
    steps = [str(s) for s in graph.plan.stream(None).steps]
    assert steps.index("run sin") < steps.index("wait e0") < steps.index("run relu")


def test_without_sinking_main_waits_before_the_branch(fake_group: None) -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.overlap_communication(
        producers=False, sink=False
    )
    compiled, backend = compile_model(_layer, config, fullgraph=True)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    assert_same(compiled(x, w), _layer(x, w), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert _names(graph, "comm") == ["all_reduce", "wait_tensor"]
    steps = [str(s) for s in graph.plan.stream(None).steps]
    assert steps.index("run mm") < steps.index("wait e1") < steps.index("run sin")


def test_collectives_on_different_streams_are_issued_in_graph_order(fake_group: None) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("comm"):
            a = funcol.all_reduce(x.sin(), "sum", dist.group.WORLD)
        b = funcol.all_reduce(x.cos(), "sum", dist.group.WORLD)  # main, later in graph order
        return a + b

    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(5)
    assert_same(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    plan = graph_of(backend, "inference").plan
    (sync,) = [s for s in plan.syncs if s.reason == "collective"]
    assert (sync.producer.name, sync.producer_stream) == ("all_reduce", "comm")
    assert (sync.consumer.name, sync.consumer_stream) == ("all_reduce_1", None)


def test_a_pass_that_reorders_collectives_is_a_stream_error(fake_group: None) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        a = funcol.all_reduce(x.sin(), "sum", dist.group.WORLD)
        b = funcol.all_reduce(x.cos(), "sum", dist.group.WORLD)
        return a + b

    def swap_collectives(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        first, second = [n for n in gm.graph.nodes if n.target is all_reduce]
        # move the second collective (and its input) in front of the first
        cos = second.args[0]
        first.prepend(cos)
        first.prepend(second)

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = swap_collectives
    compiled, _ = compile_model(model, config, fullgraph=True)
    with pytest.raises(Exception) as info:
        compiled(torch.randn(5))
    error = cause_of(info.value, airstream.StreamError)
    assert error is not None, repr(info.value)
    assert "swap_collectives" in str(error) and "reordered collectives" in str(error)
    assert "'all_reduce_1' now comes before 'all_reduce'" in str(error)


def test_overlap_communication_leaves_a_graph_without_collectives_alone() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.overlap_communication()
    compiled, backend = compile_model(lambda x: x.sin() * 2, config)
    x = torch.randn(3)
    assert_same(compiled(x), x.sin() * 2)
    assert graph_of(backend, "inference").streams.side_streams == ()
