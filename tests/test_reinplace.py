"""The final built-ins: reinplace_inplaceable_ops and reinplace_input_mutations.

Each test pairs the rewritten graph (which ops became in place, which write-backs are gone, on
which stream) with numerics against eager PyTorch: outputs, and every input after the call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, count, graph_of, targets

import airstream
from airstream.graph.effects import inplace_variant
from airstream.passes.manager import FINAL, PassManager

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten

_lib = torch.library.Library("reinplace_test", "FRAGMENT")
_lib.define("sin_cos_(Tensor x, Tensor(a!) out_sin, Tensor(b!) out_cos) -> Tensor")


@torch.library.impl(_lib, "sin_cos_", "CompositeExplicitAutograd")
def _sin_cos(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> torch.Tensor:
    out_sin.sin_()
    out_cos.cos_()
    return x + 1


@torch.library.impl(_lib, "sin_cos_", "Meta")
def _sin_cos_meta(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


sin_cos_ = torch.ops.reinplace_test.sin_cos_.default


def _config(inplaceable: bool = True, inputs: bool = True) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.experimental_config.reinplace_inplaceable_ops = inplaceable
    config.experimental_config.reinplace_input_mutations = inputs
    config.experimental_config.remove_noop_ops = False  # keep clones: they are the temporaries
    return config


def _run(fn: Any, config: airstream.CompilerConfig, *inputs: torch.Tensor) -> Any:
    """Compile and call ``fn`` on copies of ``inputs``; outputs and inputs must match eager."""
    mine = [t.clone() for t in inputs]
    theirs = [t.clone() for t in inputs]
    compiled, backend = compile_model(fn, config)
    with torch.no_grad():
        got = compiled(*mine)
        want = fn(*theirs)
    assert_same(got, want)
    assert_same(mine, theirs)
    return graph_of(backend, "inference"), got, mine


def _copies_into_inputs(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.target is aten.copy_.default and n.args[0].op == "placeholder"
    )


def test_off_by_default_and_last_in_the_pipeline() -> None:
    assert [
        s.name for s in PassManager(airstream.CompilerConfig()).passes if s.stage == FINAL
    ] == []
    config = _config()
    config.post_grad_custom_post_pass = lambda gm, example_inputs, config: None
    stages = [s.stage for s in PassManager(config).passes]
    assert stages[-3:] == ["post_grad_custom_post_pass", FINAL, FINAL]


def test_inplace_variant_knows_which_ops_have_one() -> None:
    assert inplace_variant(aten.add.Tensor) is aten.add_.Tensor
    assert inplace_variant(aten.relu.default) is aten.relu_.default
    assert inplace_variant(aten.mm.default) is None  # no mm_
    assert inplace_variant(aten.bernoulli.p) is None  # random: keeps eager's generator order
    assert inplace_variant(aten.add_.Tensor) is None  # already in place


def test_an_op_on_a_dead_temporary_runs_in_place() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.clone().add(1).relu()

    graph, _, _ = _run(fn, _config(), torch.randn(4, 4))
    gm = graph.graph_module
    assert count(gm, aten.add_.Tensor) == 1 and count(gm, aten.relu_.default) == 1
    assert count(gm, aten.add.Tensor) == 0
    off, _, _ = _run(fn, _config(inplaceable=False, inputs=False), torch.randn(4, 4))
    assert count(off.graph_module, aten.add.Tensor) == 1  # the switch turns it off


def test_graph_inputs_temporaries_read_later_and_broadcasts_stay_out_of_place() -> None:
    def fn(x: torch.Tensor, row: torch.Tensor) -> Any:
        a = x + 1  # x is an input: never written by this pass
        b = a * 2  # a is read again below: not in place
        c = a + b  # a is dead after this: in place on a
        d = row.clone() + x  # row's clone is [4], the result [3, 4]: layouts differ
        return c, d

    graph, _, _ = _run(fn, _config(inputs=False), torch.randn(3, 4), torch.randn(4))
    gm = graph.graph_module
    assert [str(t) for t in targets(gm) if "aten" in str(t)] == [
        "aten.add.Tensor",
        "aten.mul.Tensor",
        "aten.add_.Tensor",
        "aten.clone.default",
        "aten.add.Tensor",
    ]


def test_an_input_write_back_is_folded_into_the_op() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.mul_(2)
        return x + y

    graph, _, _ = _run(fn, _config(), torch.randn(4), torch.randn(4))
    gm = graph.graph_module
    assert count(gm, aten.mul_.Tensor) == 1 and count(gm, aten.mul.Tensor) == 0
    assert _copies_into_inputs(gm) == 0


def test_a_chain_of_updates_makes_the_last_one_in_place_on_the_temporary() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        x.add_(1)
        return x

    graph, _, _ = _run(fn, _config(inplaceable=False), torch.randn(5))
    gm = graph.graph_module
    # mul reads x and is the value copied back: add_ writes mul's result, then one copy into x
    assert count(gm, aten.mul.Tensor) == 1 and count(gm, aten.add_.Tensor) == 1
    assert _copies_into_inputs(gm) == 1


def test_a_new_output_never_becomes_the_input() -> None:
    # y is a new tensor the caller owns; CSE makes it the value written back into x, and folding
    # the write-back would return a view of x
    def owned(x: torch.Tensor) -> torch.Tensor:
        y = x.add(1)
        x.add_(1)
        return y.view(-1)

    graph, got, mine = _run(owned, _config(), torch.randn(3, 3))
    assert count(graph.graph_module, aten.add.Tensor) == 1
    assert got.untyped_storage().data_ptr() != mine[0].untyped_storage().data_ptr()

    # the same graph, but the output is a view of x in eager too: AOTAutograd rebuilds it from x
    assert count(graph.graph_module, aten.add_.Tensor) == 0

    def aliased(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x.view(-1)

    graph, got, mine = _run(aliased, _config(), torch.randn(3, 3))
    assert count(graph.graph_module, aten.add_.Tensor) == 1
    assert _copies_into_inputs(graph.graph_module) == 0
    assert got.untyped_storage().data_ptr() == mine[0].untyped_storage().data_ptr()


def test_an_op_reading_its_target_through_another_view_stays_out_of_place() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x.clone()
        return a + a.t()  # add_(a, a.t()) would read elements it has already overwritten

    graph, _, _ = _run(fn, _config(), torch.randn(4, 4))
    assert count(graph.graph_module, aten.add_.Tensor) == 0


def test_a_reader_on_another_stream_keeps_the_write_out_of_place() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        with airstream.stream("side"):
            seen = y.sum()  # reads y on the side stream
        y.mul_(3)  # main stream: folding it would write y while "side" may read it
        with airstream.stream("side"):
            t = x.clone()
            t2 = t.exp()  # t is read on "side" only: in place there
        return seen, t2

    graph, _, _ = _run(fn, _config(), torch.randn(4), torch.randn(4))
    gm = graph.graph_module
    assert count(gm, aten.mul.Tensor) == 1 and _copies_into_inputs(gm) == 1
    (exp,) = [n for n in gm.graph.nodes if n.target is aten.exp_.default]
    assert graph.streams.stream(exp) == "side"


def test_a_custom_op_writing_inputs_is_called_directly() -> None:
    def fn(x: torch.Tensor, s: torch.Tensor, c: torch.Tensor) -> Any:
        out = sin_cos_(x, s, c)
        return out, s.view(-1, 1) + 1  # a view taken after the call does not block it

    graph, _, _ = _run(fn, _config(), *[torch.randn(3) for _ in range(3)])
    gm = graph.graph_module
    assert sin_cos_ in targets(gm)
    assert _copies_into_inputs(gm) == 0
    assert not [t for t in targets(gm) if "auto_functionalized" in str(t)]


def test_a_custom_op_writing_a_view_of_an_input_writes_that_view() -> None:
    def fn(x: torch.Tensor, s: torch.Tensor, c: torch.Tensor) -> Any:
        return sin_cos_(x, s[1:], c)  # writes a view of s: the call writes it through the view

    graph, _, _ = _run(fn, _config(), *[torch.randn(3) for _ in range(3)])
    gm = graph.graph_module
    (call,) = [n for n in gm.graph.nodes if n.target is sin_cos_]
    view = call.kwargs["out_sin"]
    assert view.target is aten.slice.Tensor and view.args[0].op == "placeholder"
    assert _copies_into_inputs(gm) == 0
    assert not [t for t in targets(gm) if "auto_functionalized" in str(t)]


def test_a_custom_op_writing_two_slices_of_a_temporary_is_called_on_them() -> None:
    """vLLM's rotary embedding writes the query and key slices of one projection's output."""

    def fn(x: torch.Tensor) -> Any:
        qkv = x.exp()  # a temporary
        out = sin_cos_(x, qkv[:, :4], qkv[:, 4:6])
        return out, qkv.sum(1)

    graph, _, _ = _run(fn, _config(), torch.randn(5, 8))
    gm = graph.graph_module
    (call,) = [n for n in gm.graph.nodes if n.target is sin_cos_]
    slices = [call.kwargs["out_sin"], call.kwargs["out_cos"]]
    assert [v.target for v in slices] == [aten.slice.Tensor] * 2
    assert slices[0].args[0] is slices[1].args[0]  # one base, written in place
    assert not [t for t in targets(gm) if "auto_functionalized" in str(t)]


@pytest.mark.parametrize("mode", [None, "max-autotune"])
def test_a_model_with_streams_matches_eager_in_each_mode(mode: str | None) -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, cache: torch.Tensor) -> Any:
            with airstream.stream("side"):
                h = self.b(x).relu().mul(2)
            cache.add_(h.sum(0))
            return self.a(x).relu().add(1), h

    config = _config()
    if mode is not None:
        config.mode = mode
    model = Model()
    graph, _, _ = _run(model, config, torch.randn(4, 8), torch.randn(8))
    gm = graph.graph_module
    if mode is None:
        assert count(gm, aten.relu_.default) == 2 and count(gm, aten.add_.Tensor) >= 1
        relus = [n for n in gm.graph.nodes if n.target is aten.relu_.default]
        assert sorted(str(graph.streams.stream(n)) for n in relus) == ["None", "side"]


def test_dynamic_sizes_compile_once() -> None:
    # x: [s0, 1] and y: [1, s1]; the add's result is [s0, s1], not the clone's layout, so it
    # stays out of place; relu's input is provably its layout. One graph serves every size.
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.clone().add(y).relu()

    compiled, backend = compile_model(fn, _config(), dynamic=True)
    for n, m in ((3, 4), (5, 6), (7, 2)):
        x, y = torch.randn(n, 1), torch.randn(1, m)
        assert_same(compiled(x, y), fn(x, y))
    assert len(backend.graphs) == 1
    gm = backend.graphs[0].graph_module
    assert count(gm, aten.add.Tensor) == 1 and count(gm, aten.relu_.default) == 1
