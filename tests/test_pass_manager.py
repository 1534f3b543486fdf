"""The pass manager's instruments: PassError, metadata refill, verify_passes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream import PassError
from airstream.examples.guide import Model

aten = torch.ops.aten


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or getattr(current, "inner_exception", None)
    return out


def _raise_pass_error(config: airstream.CompilerConfig, model: Any, *inputs: Any) -> PassError:
    compiled, _ = compile_model(model, config)
    with pytest.raises(Exception) as info:
        compiled(*inputs)
    errors = [e for e in _chain(info.value) if isinstance(e, PassError)]
    assert errors, f"no PassError in {_chain(info.value)}"
    return errors[0]


def broken_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    raise KeyError("no such node")


def test_raising_pass_becomes_pass_error_naming_pass_stage_graph() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = broken_pass
    err = _raise_pass_error(config, Model(), torch.randn(2, 2))
    assert err.pass_name.endswith("test_pass_manager.broken_pass")
    assert err.stage == "post_grad_custom_post_pass" and err.graph_kind == "inference"
    msg = str(err)
    assert "broken_pass" in msg and "post_grad_custom_post_pass" in msg and "inference" in msg
    assert "KeyError" in msg
    assert isinstance(err.__cause__, KeyError), "chained to the original exception"


def test_pass_error_in_backward_graph_names_it() -> None:
    def fail_on_backward(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        if any(n.name.startswith("tangents") for n in gm.graph.find_nodes(op="placeholder")):
            raise RuntimeError("backward only")

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = fail_on_backward
    lin = torch.nn.Linear(3, 3)
    compiled, _ = compile_model(lin, config)
    out = compiled(torch.randn(2, 3))  # forward compiles fine
    with pytest.raises(Exception) as info:
        out.sum().backward()  # the backward graph is compiled lazily here
    err = next(e for e in _chain(info.value) if isinstance(e, PassError))
    assert err.graph_kind == "backward" and "backward graph" in str(err)


def _add_abs_without_meta(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    out = gm.graph.find_nodes(op="output")[0]
    value = out.args[0][0]
    with gm.graph.inserting_before(out):
        new = gm.graph.call_function(aten.abs.default, (value,))
    out.args = ((new, *out.args[0][1:]),)


def test_nodes_added_by_a_pass_get_meta_and_provenance() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _add_abs_without_meta
    compiled, backend = compile_model(Model(), config)
    x = torch.randn(4, 4)
    got = compiled(x)
    want = Model()(x)
    assert_same(got, (want[0].abs(), want[1]))
    gm = graph_of(backend, "inference").graph_module
    node = next(
        n for n in gm.graph.nodes if n.target is aten.abs.default and "air_inserted_by" in n.meta
    )
    assert node.meta["air_inserted_by"].endswith("_add_abs_without_meta")
    assert isinstance(node.meta["val"], torch.Tensor) and node.meta["val"].shape == (4, 4)


def _stale_meta(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """Feed sub a float64 copy of its input without updating sub's (float32) metadata."""
    sub = next(n for n in gm.graph.nodes if n.target is aten.sub.Tensor)
    with gm.graph.inserting_before(sub):
        as64 = gm.graph.call_function(
            aten._to_copy.default, (sub.args[0],), {"dtype": torch.float64}
        )
    sub.args = (as64, sub.args[1])


def test_a_rewired_node_and_those_after_it_get_fresh_metadata() -> None:
    """As Inductor's FakeTensorUpdater: a node whose arguments a pass changed is evaluated
    again (verify_passes recomputes every node: none downstream is left stale either)."""
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _stale_meta
    config.debug.verify_passes = True  # the recomputed metadata is what the inputs produce
    compiled, backend = compile_model(Model(), config)
    x = torch.randn(4, 4)
    compiled(x)
    gm = graph_of(backend, "inference").graph_module
    sub = next(n for n in gm.graph.nodes if n.target is aten.sub.Tensor)
    assert sub.meta["val"].dtype == torch.float64


def _wrong_meta(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """Claim sub computes float64 without changing what it computes."""
    sub = next(n for n in gm.graph.nodes if n.target is aten.sub.Tensor)
    sub.meta["val"] = sub.meta["val"].to(torch.float64)


def test_verify_passes_catches_stale_metadata_and_names_the_pass() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _wrong_meta
    config.debug.verify_passes = True
    err = _raise_pass_error(config, Model(), torch.randn(4, 4))
    msg = str(err)
    assert "_wrong_meta" in msg and "left the graph invalid" in msg
    assert "node 'sub'" in msg and "float64" in msg


def test_without_verify_stale_metadata_is_not_checked() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _wrong_meta
    compiled, _ = compile_model(Model(), config)
    compiled(torch.randn(4, 4))  # runs; verify_passes is the opt-in check


def _use_before_def(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    first, last = nodes[0], nodes[-1]
    first.args = (last, *first.args[1:])


def test_a_pass_that_breaks_the_graph_is_named() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _use_before_def
    err = _raise_pass_error(config, Model(), torch.randn(3, 3))
    assert "_use_before_def" in str(err)


def test_verify_passes_on_valid_pipeline_passes() -> None:
    from airstream.examples.guide import custom_pre_pass

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    config.debug.verify_passes = True
    config.experimental_config.enable_view_optimize = True
    compiled, _ = compile_model(Model(), config)
    x = torch.randn(5, 5)
    assert_same(compiled(x), Model()(x))


def test_meta_refill_with_dynamic_shapes() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _add_abs_without_meta
    config.debug.verify_passes = True
    compiled, backend = compile_model(Model(), config, dynamic=True)
    for n in (3, 7):
        x = torch.randn(n, n)
        want = Model()(x)
        assert_same(compiled(x), (want[0].abs(), want[1]))
    gm = graph_of(backend, "inference").graph_module
    node = next(n for n in gm.graph.nodes if "air_inserted_by" in n.meta)
    assert isinstance(node.meta["val"].shape[0], torch.SymInt), "symbolic shape kept"


def test_air_ops_written_without_default_are_the_ops() -> None:
    # torch.ops.air.scope_enter (the packet) was left as written: torch 2.11 dropped the pair as
    # dead code and 2.15 kept it with no stream, both silently
    def side_stream(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        sin = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default)
        with gm.graph.inserting_before(sin):
            gm.graph.call_function(torch.ops.air.scope_enter, (["_user_stream_label"], ["s1"]))
        with gm.graph.inserting_after(sin):
            gm.graph.call_function(torch.ops.air.scope_exit, ())

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = side_stream

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) + x.relu()

    compiled, backend = compile_model(fn, config)
    x = torch.randn(8)
    assert_same(compiled(x), fn(x))
    graph = graph_of(backend, "inference")
    assert graph.streams.stream_of["sin"] == "s1"
    targets = {n.target for n in graph.graph_module.graph.nodes}
    assert torch.ops.air.scope_enter.default in targets
