"""Passes written for Inductor run in airstream's pipeline: a ``CustomGraphPass`` (here a
pattern-matcher pass, written as torch's own custom-pass tests write one), a ``fn(graph)``
function and a ``CustomGraphModulePass``, in either stage; numerics against eager and against
Inductor running the same pass; what can be called neither way is refused as before."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream import torch_internals

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten

CustomGraphPass, _ = torch_internals.custom_graph_pass()


def _relu_of_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.mm(a, b))


def _clamped_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.clamp_min(torch.mm(a, b), 0.0)


class ClampInsteadOfRelu(CustomGraphPass):  # type: ignore[misc, valid-type]
    """relu(mm(a, b)) -> clamp_min(mm(a, b), 0): a pattern-matcher pass with a uuid, as
    Inductor's post-grad custom passes are written."""

    def __init__(self) -> None:
        self.patterns = torch_internals.pattern_pass("clamp_instead_of_relu")
        example = [torch.empty(4, 4), torch.empty(4, 4)]
        torch_internals.register_pattern(
            self.patterns,
            search_fn=_relu_of_mm,
            replace_fn=_clamped_mm,
            example_inputs=example,
            trace_fn=torch_internals.trace_forward(),
        )
        self.replaced = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.replaced += self.patterns.apply(graph)

    def uuid(self) -> Any:
        # one per instance: Inductor's FX graph cache keys on it, and a hit would skip the pass
        return f"airstream-test-clamp-instead-of-relu-{os.getpid()}-{id(self)}"


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b).sum(dim=1) + torch.relu(b @ a).mean()


def _targets(backend: Any) -> set[Any]:
    gm = graph_of(backend, "inference").graph_module
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("stage", ["post_grad_custom_pre_pass", "post_grad_custom_post_pass"])
def test_a_custom_graph_pass_runs_in_either_stage(stage: str) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    graph_pass = ClampInsteadOfRelu()
    config = airstream.CompilerConfig()
    config.set_option(stage, graph_pass)
    compiled, backend = compile_model(Model(), config)
    with torch.no_grad():
        assert_same(compiled(a, b), Model()(a, b))
    assert graph_pass.replaced == 2
    targets = _targets(backend)
    assert aten.clamp_min.default in targets and aten.relu.default not in targets
    graph = graph_of(backend, "inference")
    assert graph.passes[0 if stage.endswith("pre_pass") else -1].name.endswith("ClampInsteadOfRelu")


def test_the_same_pass_gives_inductors_numerics() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    under_inductor, under_airstream = ClampInsteadOfRelu(), ClampInsteadOfRelu()
    inductor = torch.compile(Model(), options={"post_grad_custom_pre_pass": under_inductor})
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = under_airstream
    compiled, _ = compile_model(Model(), config)
    with torch.no_grad():
        want = inductor(a, b)
        got = compiled(a, b)
    assert under_inductor.replaced == under_airstream.replaced == 2
    assert_same(got, want, rtol=1e-5, atol=1e-5)


def test_a_graph_function_and_a_graph_module_pass_get_what_inductor_gives() -> None:
    seen: list[Any] = []

    def on_graph(graph: torch.fx.Graph) -> None:
        seen.append(graph)

    class OnModule(torch_internals.custom_graph_module_pass()):  # type: ignore[misc]
        def __call__(self, gm: torch.fx.GraphModule) -> None:
            seen.append(gm)

        def uuid(self) -> Any:
            return "airstream-test-on-module-1"

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = [on_graph, OnModule()]
    compiled, backend = compile_model(Model(), config)
    with torch.no_grad():
        compiled(torch.randn(4, 4), torch.randn(4, 4))
    graph, gm = seen
    assert isinstance(graph, torch.fx.Graph) and isinstance(gm, torch.fx.GraphModule)
    assert graph is gm.graph  # the graph of the module the pipeline compiles
    names = [p.name for p in graph_of(backend, "inference").passes[:2]]
    assert names[0].endswith("on_graph") and names[1].endswith("OnModule")


def test_a_pass_callable_neither_way_is_refused_with_the_same_message() -> None:
    config = airstream.CompilerConfig()
    with pytest.raises(TypeError, match=r"airstream calls every pass as fn\(gm, example_inputs"):
        config.post_grad_custom_pre_pass = lambda gm, example_inputs: None


def test_a_one_argument_pass_that_wanted_the_module_hears_how_it_was_called() -> None:
    def wants_module(gm: torch.fx.GraphModule) -> None:
        gm.graph.lint()  # a Graph has no .graph

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = wants_module
    compiled, _ = compile_model(Model(), config)
    with pytest.raises(Exception, match=r"(?s)wants_module.*AttributeError.*with gm\.graph"):
        compiled(torch.randn(4, 4), torch.randn(4, 4))


def test_an_inductor_pass_object_is_called_with_the_graph_whatever_its_signature() -> None:
    seen: list[Any] = []

    class Optional(CustomGraphPass):  # type: ignore[misc, valid-type]
        def __call__(self, graph: Any, extra: Any = None, more: Any = None) -> int:
            seen.append(graph)
            return 0  # Inductor ignores it; so does airstream, without a warning

        def uuid(self) -> Any:
            return "airstream-test-optional-1"

    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = Optional()
    compiled, _ = compile_model(Model(), config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            compiled(torch.randn(4, 4), torch.randn(4, 4))
    assert len(seen) == 1 and isinstance(seen[0], torch.fx.Graph)
    assert not [w for w in caught if "return value of a pass" in str(w.message)]
