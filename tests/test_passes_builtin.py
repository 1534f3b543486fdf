"""Built-in passes: each one's effect on the graph (op counts) and numerics against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, count, graph_of, slow, targets

import airstream
from airstream.passes.builtin import BUILTIN_PASSES
from airstream.passes.manager import PassManager

air = torch.ops.air
aten = torch.ops.aten
LABEL = "_user_stream_label"


def _only(*enabled: str) -> airstream.CompilerConfig:
    """A config with only the named built-in switches on."""
    config = airstream.CompilerConfig()
    for option, _ in BUILTIN_PASSES:
        config.set_option(option, option.rsplit(".", 1)[1] in enabled)
    return config


def _run(model: Any, config: airstream.CompilerConfig, *inputs: torch.Tensor) -> Any:
    compiled, backend = compile_model(model, config)
    with torch.no_grad():
        assert_same(compiled(*inputs), model(*inputs))
    return graph_of(backend, "inference").graph_module


def test_each_switch_controls_its_pass() -> None:
    names = [s.name for s in PassManager(airstream.CompilerConfig()).passes]
    assert names == ["remove_noop_ops", "cse", "dead_code_elimination"]
    config = _only("enable_view_optimize")
    assert [s.name for s in PassManager(config).passes] == ["view_to_reshape"]
    assert PassManager(_only()).passes == ()


class _Noops(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.relu()
        a = y.view(y.shape)  # same shape: no-op
        b = a[:, :]  # full slice: no-op
        c = b.expand(y.shape)  # same shape: no-op
        d = c.permute(0, 1)  # identity: no-op
        e = d.view(-1)  # real reshape: kept
        f = x + 0  # computes a copy: kept
        return e, f


def test_remove_noop_ops() -> None:
    x = torch.randn(4, 5)
    kept = _run(_Noops(), _only(), x)
    removed = _run(_Noops(), _only("remove_noop_ops"), x)
    assert len(targets(kept)) - len(targets(removed)) >= 3
    assert count(removed, aten.view.default) == 1, "only the shape-changing view is left"
    assert count(removed, aten.add.Tensor) == 1, "x + 0 is a copy, never removed"


class _InputAlias(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape)


def test_noop_view_of_input_returned_keeps_eager_aliasing() -> None:
    compiled, _ = compile_model(_InputAlias(), _only("remove_noop_ops"))
    x = torch.randn(3)
    out = compiled(x)
    assert_same(out, x)
    out.add_(1)  # the output aliases the input in eager; it must here too
    assert_same(x, out)


class _ViewOfPermute(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(1, 0).contiguous().view(-1) * 2


def test_view_to_reshape() -> None:
    x = torch.randn(4, 6)
    gm = _run(_ViewOfPermute(), _only("enable_view_optimize"), x)
    assert count(gm, aten.view.default) == 0 and count(gm, aten.reshape.default) >= 1
    gm_off = _run(_ViewOfPermute(), _only(), x)
    assert count(gm_off, aten.view.default) >= 1


def _add_dead_nodes(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    x = next(iter(gm.graph.find_nodes(op="placeholder")))
    out = gm.graph.find_nodes(op="output")[0]
    with gm.graph.inserting_before(out):
        gm.graph.call_function(aten.abs.default, (x,))  # dead
        gm.graph.call_function(air.record.default, ())  # unused token: side effect, kept
        gm.graph.call_function(aten.rand.default, ([2],))  # unused, but advances the generator


def test_dead_code_elimination_keeps_air_and_rng() -> None:
    config = _only("eliminate_dead_code")
    config.post_grad_custom_pre_pass = _add_dead_nodes
    gm = _run(lambda x: x * 2, config, torch.randn(3))
    assert count(gm, aten.abs.default) == 0, "a dead pure node is erased"
    assert count(gm, air.record.default) == 1, "an unused record token is kept"
    # (Dynamo already drops unused rand calls from model code, as aot_eager shows; an unused
    # random op a pass adds must still survive: erasing it would shift the generator.)
    assert count(gm, aten.rand.default) == 1


def _duplicate_around_marker(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """Put the second of the three relus (and what follows) behind a stream marker."""
    relus = [n for n in gm.graph.nodes if n.target is aten.relu.default]
    with gm.graph.inserting_before(relus[2]):
        gm.graph.call_function(air.scope_enter.default, ([LABEL], ["s1"]))
    with gm.graph.inserting_after(relus[2]):
        gm.graph.call_function(air.scope_exit.default, ())


class _ThreeRelus(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() + x.relu() + x.relu()


def test_cse_merges_within_a_region_only() -> None:
    x = torch.randn(6)
    gm = _run(_ThreeRelus(), _only("cse"), x)
    assert count(gm, aten.relu.default) == 1
    config = _only("cse")
    config.post_grad_custom_pre_pass = _duplicate_around_marker
    gm = _run(_ThreeRelus(), config, x)
    assert count(gm, aten.relu.default) == 2, "the relu behind the marker is not merged"


def _two_records(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    out = gm.graph.find_nodes(op="output")[0]
    with gm.graph.inserting_before(out):
        r1 = gm.graph.call_function(air.record.default, ())
        r2 = gm.graph.call_function(air.record.default, ())
        gm.graph.call_function(air.wait.default, ([r1, r2],))


class _TwoRandoms(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(3) + torch.rand(3)


def test_cse_never_merges_air_or_random_ops() -> None:
    config = _only("cse")
    config.post_grad_custom_pre_pass = _two_records
    gm = _run(lambda x: x * 2, config, torch.randn(3))
    assert count(gm, air.record.default) == 2

    compiled, backend = compile_model(_TwoRandoms(), _only("cse"))
    x = torch.randn(3)
    torch.manual_seed(3)
    got = compiled(x)
    torch.manual_seed(3)
    assert_same(got, _TwoRandoms()(x))
    assert count(graph_of(backend, "inference").graph_module, aten.rand.default) == 2


def test_cse_keeps_two_allocations_two_buffers() -> None:
    def two_buffers(x: torch.Tensor) -> Any:
        a, b = torch.empty_like(x), torch.empty_like(x)
        return a.copy_(x), b.copy_(x * 2)  # merged, both results would be one buffer

    gm = _run(two_buffers, _only("cse"), torch.randn(3))
    assert count(gm, aten.empty_like.default) == 2


def _erase_wait(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    for node in list(gm.graph.nodes):
        if node.target is air.wait.default:
            gm.graph.erase_node(node)


def test_a_builtin_that_drops_an_air_op_is_caught(
    monkeypatch: pytest.MonkeyPatch, compiled_here: None
) -> None:
    import airstream.passes.manager as manager

    bad = (("experimental_config.cse", _erase_wait),)
    monkeypatch.setattr(manager, "BUILTIN_PASSES", bad)
    from airstream.examples.guide import Model, custom_pre_pass

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    compiled, _ = compile_model(Model(), config)
    with pytest.raises(Exception, match=r"_erase_wait.*changed the air ops.*removed \['wait"):
        compiled(torch.randn(3, 3))


class _Copies(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.clone() + y  # the clone is only read: removed
        b = torch.cat([y], 0).repeat(1, 1) * 1  # cat of one, repeat by ones, * 1: removed
        c = torch.nn.functional.pad(a, [0, 0, 0, 0]) ** 1  # zero pad, ** 1: removed
        return c, b + x.ceil()  # ceil of a float: a real op, kept


def test_remove_noop_ops_drops_copies_equal_to_their_input() -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    kept = _run(_Copies(), _only(), x, y)
    removed = _run(_Copies(), _only("remove_noop_ops"), x, y)
    for op in (aten.clone.default, aten.cat.default, aten.repeat.default, aten.mul.Tensor):
        assert count(kept, op) == 1 and count(removed, op) == 0, op
    assert count(removed, aten.constant_pad_nd.default) == 0
    assert count(removed, aten.pow.Tensor_Scalar) == 0
    assert count(removed, aten.ceil.default) == 1, "ceil of a float changes values"


class _CopyOfInputReturned(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.clone(), x + 0


class _CopyThenInputWritten(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        saved = x.clone()
        x.mul_(2)  # the input is written after the clone read it
        return saved + x


def test_copies_that_would_share_memory_are_kept() -> None:
    x = torch.randn(5)
    gm = _run(_CopyOfInputReturned(), _only("remove_noop_ops"), x)
    assert count(gm, aten.clone.default) == 1 and count(gm, aten.add.Tensor) == 1
    compiled, _ = compile_model(_CopyOfInputReturned(), _only("remove_noop_ops"))
    a, b = compiled(x)
    assert a.data_ptr() != x.data_ptr() and b.data_ptr() != x.data_ptr()

    compiled, backend = compile_model(_CopyThenInputWritten(), _only("remove_noop_ops"))
    x1, x2 = torch.randn(5), None
    x2 = x1.clone()
    with torch.no_grad():
        assert_same(compiled(x1), _CopyThenInputWritten()(x2))
    assert_same(x1, x2)
    assert count(graph_of(backend, "inference").graph_module, aten.clone.default) == 1


@slow(
    "C++ kernels for 3 unsigned dtypes",
    "tests/test_backend.py::test_max_autotune_runs_without_warning",
)
def test_wide_unsigned_dtypes_run_as_compiled_code_in_max_autotune() -> None:
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"
    for dtype in (torch.uint16, torch.uint32, torch.uint64):
        torch.compiler.reset()
        compiled, backend = compile_model(lambda a, b: a + b, config)
        a = torch.arange(6).to(dtype)  # (aten has no CPU arange or add for these dtypes)
        out = compiled(a, a)
        assert out.dtype == dtype and out.to(torch.int64).tolist() == [2 * i for i in range(6)]
        assert len(graph_of(backend, "inference").segments) == 1, "one op, still compiled"
