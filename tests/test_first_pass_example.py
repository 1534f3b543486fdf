"""examples/first_pass.py, the README's first pass: what it places on the side stream in each
graph of the compile, and that its results equal eager PyTorch's."""

from __future__ import annotations

import copy
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

from airstream import passes
from airstream.ops.library import is_air_op

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "first_pass.py"
aten = torch.ops.aten


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    return runpy.run_path(str(EXAMPLE))


def ops(graph: Any) -> list[torch.fx.Node]:
    """The graph's call_function nodes that run (air markers left out)."""
    nodes = graph.graph_module.graph.nodes
    return [n for n in nodes if n.op == "call_function" and not is_air_op(n.target)]


def in_branch(node: torch.fx.Node, branch: str) -> bool:
    return any(p == branch or p.startswith(branch + ".") for p in passes.module_paths(node))


def test_first_pass_places_the_right_branch_in_every_graph(
    example: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run = example["main"]()
    out = capsys.readouterr().out
    for kind in ("inference", "forward", "backward"):
        assert f"--- {kind} graph:" in out
    assert "-> side" in out and "outputs and gradients match eager" in out

    graphs = run.backend.graphs
    assert [g.kind for g in graphs] == ["inference", "forward", "backward"]
    for graph in graphs:
        assert graph.streams.side_streams == ("side",)
        side = [n for n in ops(graph) if graph.streams.stream(n) == "side"]
        main = [n for n in ops(graph) if graph.streams.stream(n) is None]
        # Exactly the right branch's ops (its gradients in backward) run on the side stream.
        assert side and all(in_branch(n, "right") for n in side), [n.name for n in side]
        assert not any(in_branch(n, "right") for n in main), [n.name for n in main]
        assert any(in_branch(n, "left") for n in main)
        side_targets = [n.target for n in side]
        main_targets = [n.target for n in main]
        if graph.kind == "backward":
            assert side_targets.count(aten.mm.default) == 4  # 2 linears: input and weight grads
            assert main_targets.count(aten.mm.default) == 4
            assert aten.silu_backward.default in side_targets
            assert aten.gelu_backward.default in main_targets
            assert aten.native_layer_norm_backward.default in main_targets
        else:
            assert side_targets.count(aten.addmm.default) == 2
            assert main_targets.count(aten.addmm.default) == 2
            assert aten.silu.default in side_targets and aten.gelu.default in main_targets


def test_first_pass_matches_eager_on_new_inputs(example: dict[str, Any]) -> None:
    run = example["main"](show=False)
    compiled_graphs = len(run.backend.graphs)
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        torch.testing.assert_close(run.compiled(x), run.model(x))

    reference = copy.deepcopy(run.model)
    for p in [*run.model.parameters(), *reference.parameters()]:
        p.grad = None
    run.compiled(x).sum().backward()
    reference(x).sum().backward()
    for p, q in zip(run.model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert len(run.backend.graphs) == compiled_graphs  # same shapes: nothing compiled again
