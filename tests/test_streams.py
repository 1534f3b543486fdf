"""Stream analysis: node -> stream rules, and the StreamErrors for bad stream programs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream import StreamError, torch_internals
from airstream.graph.nodes import GRAPH_KIND_KEY
from airstream.graph.streams import assign_streams, lower_streams

graph_break = torch_internals.dynamo_graph_break()

air = torch.ops.air
LABEL = "_user_stream_label"


def _trace(fn: Any, *args: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def _by_name(gm: torch.fx.GraphModule, prefix: str) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.name.startswith(prefix)]


def test_nested_scopes_innermost_label_wins() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["outer"])
        a = x.sin()
        air.scope_enter([LABEL], ["inner"])
        b = a.cos()
        air.scope_exit()
        air.scope_enter(["_super_kernel_scope"], ["sk"])  # not a stream scope
        c = b.exp()
        air.scope_exit()
        air.scope_exit()
        return c.neg()

    gm = _trace(f, torch.randn(3))
    s = assign_streams(gm)
    assert [s.stream(n) for n in ("sin", "cos", "exp", "neg")] == ["outer", "inner", "outer", None]
    assert s.streams == (None, "outer", "inner")
    assert s.scope_attrs["exp"] == {"_super_kernel_scope": "sk"}
    exp = next(n for n in gm.graph.nodes if n.name == "exp")
    assert "air_scope" not in exp.meta  # the analysis reads the graph only
    assert s.nodes_on("inner") == ["cos"]


def test_annotation_applies_outside_scopes_only() -> None:
    gm = _trace(lambda x: x.sin().cos(), torch.randn(3))
    # Set the annotations as Dynamo does for code under airstream.stream / fx annotate.
    for node in gm.graph.nodes:
        if node.name == "sin":
            torch_internals.set_annotations(node, {"air_stream": "ann", "air_stream_priority": -1})
        if node.name == "cos":
            torch_internals.set_annotations(node, {"air_stream": "ann"})
    s = assign_streams(gm)
    assert s.stream("sin") == "ann" and s.priorities == {"ann": -1}

    def g(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["scoped"])
        a = x.sin()
        air.scope_exit()
        return a

    gm = _trace(g, torch.randn(3))
    for node in gm.graph.nodes:
        torch_internals.set_annotations(node, {"air_stream": "ann"})
    assert assign_streams(gm).stream("sin") == "scoped", "the scope wins over the annotation"


def test_priority_from_scope() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL, "_user_stream_priority"], ["hi", "-2"])
        a = x.sin()
        air.scope_exit()
        return a

    assert assign_streams(_trace(f, torch.randn(2))).priorities == {"hi": -2}


def test_single_stream_still_checks_pairing() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["s"])
        return x.sin()

    gm = _trace(f, torch.randn(2))
    with pytest.raises(StreamError, match="never closed"):
        lower_streams(gm, single_stream=True)


def test_unclosed_scope_names_node_and_graph_break() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["s1"])
        return x.sin()

    gm = _trace(f, torch.randn(2))
    gm.meta[GRAPH_KIND_KEY] = "forward"  # as the pipeline stamps each graph
    with pytest.raises(StreamError) as info:
        assign_streams(gm)
    msg = str(info.value)
    assert "scope_enter" in msg and "'s1'" in msg and "forward graph" in msg
    assert "graph break inside a stream scope is the usual cause" in msg


def test_exit_without_enter() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a = x.sin()
        air.scope_exit()
        return a

    with pytest.raises(StreamError, match=r"scope_exit.*never\s+opened.*graph break"):
        assign_streams(_trace(f, torch.randn(2)))


def test_wait_on_non_token_non_tensor() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    gm = _trace(f, torch.randn(2))
    sin = next(n for n in gm.graph.nodes if n.name == "sin")
    with gm.graph.inserting_after(sin):
        size = gm.graph.call_function(torch.ops.aten.sym_size.int, (sin, 0))
        size.meta["val"] = 2
    with gm.graph.inserting_after(size):
        gm.graph.call_function(air.wait.default, ([size],))
    with pytest.raises(
        StreamError,
        match=r"element 0 of wait's list is node 'sym_size_int'.*"
        r"neither a record token nor a tensor",
    ):
        assign_streams(gm)


def test_wait_on_empty_list() -> None:
    gm = _trace(lambda x: x.sin(), torch.randn(2))
    sin = next(n for n in gm.graph.nodes if n.name == "sin")
    with gm.graph.inserting_after(sin):
        gm.graph.call_function(air.wait.default, ([],))
    with pytest.raises(StreamError, match="non-empty list"):
        assign_streams(gm)


def test_wait_on_record_and_on_tensor_are_valid() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["s"])
        a = x.sin()
        r = air.record()
        air.scope_exit()
        air.wait([r, a])
        return air.wait_tensor(x.cos(), a)

    s = assign_streams(_trace(f, torch.randn(2)))
    assert s.stream("record") == "s" and s.stream("wait") is None


def test_mismatched_keys_and_values() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL, "_user_stream_priority"], ["s"])
        a = x.sin()
        air.scope_exit()
        return a

    with pytest.raises(StreamError, match="2 keys but 1 values"):
        assign_streams(_trace(f, torch.randn(2)))


def _unpaired_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        gm.graph.call_function(air.scope_enter.default, ([LABEL], ["lost"]))


def test_unpaired_scope_from_a_pass_names_the_pass() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _unpaired_pass
    compiled, _ = compile_model(lambda x: x.sin() + 1, config)
    with pytest.raises(Exception) as info:
        compiled(torch.randn(3))
    msg = str(info.value)
    assert "StreamError" in msg and "inserted by pass" in msg and "_unpaired_pass" in msg


class _BreakInsideMarkers(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops.air.scope_enter([LABEL], ["s1"])
        y = x.sin()
        graph_break()
        z = y.cos()
        torch.ops.air.scope_exit()
        return z


def test_graph_break_between_raw_markers_is_a_clear_stream_error() -> None:
    compiled, _ = compile_model(_BreakInsideMarkers())
    with pytest.raises(Exception) as info:
        compiled(torch.randn(3))
    msg = str(info.value)
    assert "StreamError" in msg and "graph break inside a stream scope" in msg
    assert "test_streams.py" in msg, "the message names the source line"


class _BreakInsideStream(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            y = x.sin()
            graph_break()
            z = y.cos()
        return z + 1


def test_graph_break_inside_airstream_stream_warns_and_stays_correct() -> None:
    compiled, backend = compile_model(_BreakInsideStream())
    x = torch.randn(5)
    with pytest.warns(UserWarning, match=r"airstream.stream\('s1'\) ran eagerly.*graph break"):
        got = compiled(x)
    assert_same(got, _BreakInsideStream()(x))
    assert all(g.streams.side_streams == () for g in backend.graphs)


def test_fullgraph_reports_the_break() -> None:
    compiled, _ = compile_model(_BreakInsideStream(), fullgraph=True)
    with pytest.raises(torch_internals.dynamo_unsupported()):
        compiled(torch.randn(5))


def test_wait_tensor_on_non_tensor() -> None:
    gm = _trace(lambda x: x.sin(), torch.randn(2))
    sin = next(n for n in gm.graph.nodes if n.name == "sin")
    with gm.graph.inserting_after(sin):
        size = gm.graph.call_function(torch.ops.aten.sym_size.int, (sin, 0))
        size.meta["val"] = 2
    with gm.graph.inserting_after(size):
        gm.graph.call_function(air.wait_tensor.default, (sin, size))
    with pytest.raises(
        StreamError,
        match=r"wait_tensor's 'dependency' argument must be a node "
        r"producing a tensor, got node 'sym_size_int'",
    ):
        assign_streams(gm)
