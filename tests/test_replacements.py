"""Pattern replacements (airstream.passes.Replacements) and torchair.register_replacement."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, count, graph_of, ops_by_stream

import airstream
import airstream.compat.torchair as torchair
from airstream.compat.torchair import patterns as torchair_patterns

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten

_lib = torch.library.Library("replacements_test", "FRAGMENT")
_lib.define("sub_sigmoid(Tensor x, Tensor y) -> Tensor")
_lib.impl("sub_sigmoid", lambda x, y: torch.sigmoid(x - y), "CompositeExplicitAutograd")
_lib.impl("sub_sigmoid", lambda x, y: torch.empty_like(x), "Meta")
fused = torch.ops.replacements_test.sub_sigmoid.default


def search(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sub(x, y).sigmoid()


def replace(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.ops.replacements_test.sub_sigmoid(x, y)


EXAMPLE = (torch.empty(4, 4), torch.empty(4, 4))


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        main = (a - b).sigmoid() * 2  # a match on the main stream
        with airstream.stream("side"):
            d = a - b
        across = d.sigmoid()  # sub on "side", sigmoid on main: spans a stream's edge
        return main, across


@pytest.fixture(autouse=True)
def _no_torchair_rules() -> Iterator[None]:
    torchair_patterns.forget_all()
    yield
    torchair_patterns.forget_all()


def test_a_registered_pattern_is_replaced_where_it_does_not_cross_streams() -> None:
    fusions = airstream.passes.Replacements()
    fusions.register(search, replace, EXAMPLE)
    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = fusions
    compiled, backend = compile_model(Model(), config)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(compiled(a, b), Model()(a, b), rtol=1e-6, atol=1e-6)
    graph = graph_of(backend, "inference")
    gm = graph.graph_module
    assert count(gm, fused) == 1  # the main-stream match
    (sigmoid,) = [n for n in gm.graph.nodes if n.target is aten.sigmoid.default]
    assert graph.streams.stream(sigmoid) is None  # the cross-stream one is kept as it was
    (sub,) = [n for n in gm.graph.nodes if n.target is aten.sub.Tensor]
    assert graph.streams.stream(sub) == "side"


def test_extra_check_vetoes_a_match() -> None:
    seen: list[Any] = []

    def only_wide(match: Any) -> bool:
        seen.append(match)
        return match.kwargs["x"].meta["val"].shape[-1] >= 8

    fusions = airstream.passes.Replacements()
    fusions.register(search, replace, EXAMPLE, extra_check=only_wide)
    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = fusions
    compiled, backend = compile_model(lambda a, b: (a - b).sigmoid(), config)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(compiled(a, b), (a - b).sigmoid())
    assert seen and count(graph_of(backend, "inference").graph_module, fused) == 0


def test_register_checks_its_functions() -> None:
    fusions = airstream.passes.Replacements()
    with pytest.raises(TypeError, match="replace_fn must be a function"):
        fusions.register(search, None, EXAMPLE)  # type: ignore[arg-type]
    assert fusions.count == 0


def _torchair_compile(pattern_fusion_pass: bool | None) -> Any:
    config = torchair.CompilerConfig()
    if pattern_fusion_pass is not None:
        config.experimental_config.pattern_fusion_pass = pattern_fusion_pass
    backend = torchair.get_npu_backend(compiler_config=config)
    compiled = torch.compile(lambda a, b: (a - b).sigmoid() + 1, backend=backend)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(compiled(a, b), (a - b).sigmoid() + 1, rtol=1e-6, atol=1e-6)
    return backend.graphs[-1]


def _fused_calls(graph: Any) -> int:
    """How many times the compiled graph calls ``fused``, a max-autotune segment's members
    included (a custom op that writes nothing is compiled into the segment)."""
    return sum(n for (op, _), n in ops_by_stream(graph).items() if op is fused)


def test_torchair_register_replacement_applies_unless_pattern_fusion_is_off() -> None:
    assert _fused_calls(_torchair_compile(None)) == 0  # nothing registered yet
    torch.compiler.reset()
    torchair.register_replacement(search_fn=search, replace_fn=replace, example_inputs=EXAMPLE)
    assert _fused_calls(_torchair_compile(None)) == 1
    torch.compiler.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the switch acts here: no "no effect off the NPU"
        graph = _torchair_compile(False)
    assert _fused_calls(graph) == 0
