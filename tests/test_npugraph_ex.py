"""TorchAir's current names off the NPU: npugraph_ex's ``torch.ops.npugraph_ex`` stream ops in
custom passes, its ``backend="npugraph_ex"``, and its multi-stream model code (``torch.npu.Stream``,
``torch.npu.stream``, ``torch.npu.Event``, ``record_stream``), which on a CPU machine runs on
airstream's streams through PyTorch's stream IR."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream.compat.torchair import ops as torchair_ops

aten = torch.ops.aten
npu_install = importlib.import_module("airstream.compat.torchair.install")


def _mm_abs_on_a_side_stream(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """A pass in npugraph_ex's words: mm and abs on stream_1, sub after abs."""
    ops = torch.ops.npugraph_ex
    graph = gm.graph
    mm = next(n for n in graph.nodes if n.target is aten.mm.default)
    abs_ = next(n for n in graph.nodes if n.target is aten.abs.default)
    sub = next(n for n in graph.nodes if n.target is aten.sub.Tensor)
    with graph.inserting_before(mm):
        graph.call_function(ops.scope_enter.default, (["_user_stream_label"], ["stream_1"]))
    with graph.inserting_after(abs_):
        token = graph.call_function(ops.record.default, ())
    with graph.inserting_after(token):
        graph.call_function(ops.scope_exit.default, ())
    with graph.inserting_before(sub):
        graph.call_function(ops.wait.default, ([token],))


def _mm_abs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mm = torch.mm(x, x)
    return torch.abs(mm) + 1, torch.sub(x, mm)


def test_npugraph_ex_ops_in_a_pass_are_the_air_ops() -> None:
    torchair_ops.define_npugraph_ex_ops()
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _mm_abs_on_a_side_stream
    compiled, backend = compile_model(_mm_abs, config)
    x = torch.randn(6, 6)
    with torch.no_grad():
        assert_same(compiled(x), _mm_abs(x))
    graph = graph_of(backend, "inference")
    calls = [n for n in graph.graph_module.graph.nodes if n.op == "call_function"]
    on = {n.target: graph.streams.stream(n) for n in calls}
    assert on[aten.mm.default] == on[aten.abs.default] == "stream_1"
    assert on[aten.sub.Tensor] is None
    targets = {n.target for n in graph.graph_module.graph.nodes}
    assert not any("npugraph_ex" in str(t) for t in targets), "read as the air ops"
    token = next(n for n in calls if n.target is torch.ops.air.record.default)
    waited = next(n for n in calls if n.target is torch.ops.air.wait.default)
    assert graph.streams.stream(token) == "stream_1" and graph.streams.stream(waited) is None


class _NpuStreams(torch.nn.Module):
    """npugraph_ex's multi-stream pattern (in our words): streams and events made in forward,
    an event recorded on the default stream and waited for in a block, another recorded in the
    block and waited for in a second one."""

    def __init__(self, npu: Any) -> None:
        super().__init__()
        self.npu = npu

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        npu = self.npu
        first, second = npu.Stream(), npu.Stream()
        ready, done = npu.Event(), npu.Event()
        total = a + b
        product = b * 2
        ready.record()
        with npu.stream(first):
            ready.wait(first)
            side = torch.mm(product, b)
            done.record()
        main = torch.mm(a, b)
        with npu.stream(second):
            done.wait(second)
            late = side + 1
        return total, side, main, late


def test_npu_streams_and_events_in_model_code_run_on_streams_on_cpu() -> None:
    npu = npu_install._npu_namespace("cpu")
    model = _NpuStreams(npu)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    want = model(a, b)  # eagerly: the CPU stand-ins order nothing, as CPU code needs
    compiled, backend = compile_model(model, fullgraph=True)
    with torch.no_grad():
        assert_same(compiled(a, b), want)
    graph = graph_of(backend, "inference")
    nodes = graph.graph_module.graph.nodes
    mms = [graph.streams.stream(n) for n in nodes if n.target is aten.mm.default]
    assert mms[0] not in (None, mms[1]) and mms[1] is None, mms  # side on the first stream
    (late,) = [n for n in nodes if n.target is aten.add.Tensor][1:]
    assert graph.streams.stream(late) not in (None, mms[0])  # the second stream
    pairs = {
        (s.producer_stream, s.consumer_stream) for s in graph.plan.syncs if s.reason == "control"
    }
    assert (None, mms[0]) in pairs and (mms[0], graph.streams.stream(late)) in pairs


_SCRIPT = """
import torch
import torch_npu


def _pass(gm, example_inputs, config):
    graph = gm.graph
    for node in list(graph.nodes):
        if node.target == torch.ops.aten.mm.default:
            with graph.inserting_before(node):
                graph.call_function(torch.ops.npugraph_ex.scope_enter.default,
                                    (["_user_stream_label"], ["stream_1"]))
            with graph.inserting_after(node):
                graph.call_function(torch.ops.npugraph_ex.scope_exit.default, ())


class Model(torch.nn.Module):
    def forward(self, x, y):
        side = torch.npu.Stream()
        event = torch.npu.Event()
        total = x + y
        event.record()
        with torch.npu.stream(side):
            event.wait(side)
            out = torch.mm(total, y)
            total.record_stream(side)
        return out.relu() + torch.mm(x, x)


model = Model().npu()
compiled = torch.compile(model, backend="npugraph_ex",
                         options={"post_grad_custom_post_pass": _pass})
x, y = torch.randn(4, 4).npu(), torch.randn(4, 4).npu()
print("equal:", torch.allclose(compiled(x, y), model(x, y)))
"""


def test_an_npugraph_ex_script_runs_unchanged_under_run_torchair(tmp_path: Path) -> None:
    """backend="npugraph_ex" with a post pass writing npugraph_ex ops, and a torch.npu stream
    block with events and record_stream in the model: what ran where is reported."""
    script = tmp_path / "npugraph_ex_streams.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "airstream.cli", "run", "--torchair", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "equal: True" in done.stdout
    assert "stream stream#0: mm" in done.stdout, done.stdout  # the model's torch.npu.Stream
    assert "stream stream_1: mm" in done.stdout, done.stdout  # the pass's npugraph_ex scope


def test_npugraph_ex_compile_fx_builds_a_custom_backend() -> None:
    """torch.npu.npugraph_ex.compile_fx(gm, example_inputs, options) as an AOTAutograd
    compiler, with npugraph_ex's option names (a pass among them)."""
    from airstream.compat.torchair import config as compat_config
    from airstream.torch_internals import aot_module_simplified

    npu = npu_install._npu_namespace("cpu")
    torchair_ops.define_npugraph_ex_ops()
    seen: list[str] = []
    compat_config._warned.discard("debug.aclgraph.clone_input")  # warned once per process

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        options = {"clone_input": False, "post_grad_custom_pre_pass": _mm_abs_on_a_side_stream}
        compiled = npu.npugraph_ex.compile_fx(gm, example_inputs, options)
        seen.append(type(compiled).__name__)
        return compiled

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler)

    x = torch.randn(5, 5)
    with torch.no_grad(), pytest.warns(UserWarning, match="clone_input' has no effect off"):
        assert_same(torch.compile(_mm_abs, backend=backend)(x), _mm_abs(x))
    assert seen == ["CpuExecutor"]  # the pass's stream_1 runs on its own thread
