"""Training through airstream: markers stay in forward, streams reach backward, grads match."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.conftest import assert_same, compile_model, count, graph_of, ops_by_stream

import airstream

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

air = torch.ops.air
aten = torch.ops.aten


class _TwoBranch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("side"):
            left = torch.relu(self.a(x))
        right = torch.tanh(self.b(x))
        return (left * right).sum(dim=-1)


def _air_ops(gm: torch.fx.GraphModule) -> list[object]:
    return [
        n.target for n in gm.graph.nodes if n.op == "call_function" and n.target.namespace == "air"
    ]


def test_gradients_equal_eager_and_markers_stay_in_forward() -> None:
    torch.manual_seed(0)
    model = _TwoBranch()
    reference = copy.deepcopy(model)
    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(4, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()

    compiled(x).sum().backward()
    reference(x_ref).sum().backward()
    assert_same(x.grad, x_ref.grad)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_same(p.grad, q.grad)

    fwd, bwd = graph_of(backend, "forward"), graph_of(backend, "backward")
    assert _air_ops(fwd.graph_module) == [air.scope_enter.default, air.scope_exit.default]
    assert _air_ops(bwd.graph_module) == [], "the backward graph holds no copied markers"
    # Forward: the first linear and its relu run on "side"; the annotation carries the stream
    # into the backward graph (the relu's and the linear's gradients).
    assert (
        fwd.streams.stream(
            next(n for n in fwd.graph_module.graph.nodes if n.target is aten.relu.default)
        )
        == "side"
    )
    side_bwd = bwd.streams.nodes_on("side")
    assert side_bwd, "backward nodes of the stream block carry its label"
    assert any(
        n.target is aten.threshold_backward.default
        for n in bwd.graph_module.graph.nodes
        if n.name in side_bwd
    )


def test_gradients_equal_eager_in_the_default_mode(default_mode: None) -> None:
    """Forward and backward as users compile them: each graph's streams in Inductor segments."""
    torch.manual_seed(0)
    model = _TwoBranch()
    reference = copy.deepcopy(model)
    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(4, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    compiled(x).sum().backward()
    reference(x_ref).sum().backward()
    assert_same(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_same(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    for kind in ("forward", "backward"):
        graph = graph_of(backend, kind)
        assert graph.mode == "max-autotune" and graph.fallbacks == 0, kind
        assert "side" in graph.streams.side_streams, kind
        assert any(s.node is not None for s in graph.segments), kind
    counts = ops_by_stream(graph_of(backend, "backward"))
    assert counts.get((aten.threshold_backward.default, "side"), 0) == 1  # relu's gradient


def test_several_optimizer_steps_match_eager() -> None:
    torch.manual_seed(1)
    model = _TwoBranch()
    reference = copy.deepcopy(model)
    compiled, _ = compile_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
        for m, o in ((compiled, opt), (reference, opt_ref)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_same(p, q, rtol=1e-6, atol=1e-6)


def test_inference_graph_keeps_markers_once() -> None:
    model = _TwoBranch()
    compiled, backend = compile_model(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    gm = graph_of(backend, "inference").graph_module
    assert count(gm, air.scope_enter.default) == 1 and count(gm, air.scope_exit.default) == 1


class _RepeatedMarkers(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("a"):
            y = x.sin()
        z = y.cos()
        with airstream.stream("a"):  # identical markers to the first block
            w = z.sin()
        r1 = airstream.ops.record()
        airstream.ops.record()  # an identical, unused token
        airstream.ops.wait([r1])
        airstream.ops.wait([r1])  # an identical wait
        return w.exp()


def test_identical_markers_are_never_merged_in_training() -> None:
    # Regression: the min-cut partitioner's own CSE merged the second stream block's markers
    # into the first, moving the second sin to the main stream.
    compiled, backend = compile_model(_RepeatedMarkers(), fullgraph=True)
    x = torch.randn(5, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    compiled(x).sum().backward()
    _RepeatedMarkers()(x_ref).sum().backward()
    assert_same(x.grad, x_ref.grad)
    fwd = graph_of(backend, "forward")
    gm = fwd.graph_module
    for op in (air.scope_enter, air.scope_exit, air.record, air.wait):
        assert count(gm, op.default) == 2, op
    sins = [n for n in gm.graph.nodes if n.target is aten.sin.default]
    assert [fwd.streams.stream(n) for n in sins] == ["a", "a"]
    assert (
        fwd.streams.stream(next(n for n in gm.graph.nodes if n.target is aten.cos.default)) is None
    )
