"""airstream's stream passes as Inductor custom passes (``airstream.inductor.for_inductor``):
what the pass hands Inductor is the same stream program written in PyTorch's stream IR.

On CPU, Inductor compiles a graph and ignores its streams, and torch's CPU build cannot run
their events; so the graph the pass writes is checked here as Inductor receives it, and run
through airstream's own lowering of PyTorch's IR (which must give the same streams and results
as the pass in airstream's form). ``cuda``-marked tests run it under Inductor on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of, slow

import airstream
from airstream import passes, torch_internals
from airstream.inductor import for_inductor

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten


class _Moe(torch.nn.Module):
    """A shared expert beside a router and two experts (the shape auto passes look for)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(32, 2)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2))
        self.shared_expert = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.SiLU())
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.gate(x), dim=-1)
        routed = sum(weights[:, i : i + 1] * e(x) for i, e in enumerate(self.experts))
        return routed + self.down(self.shared_expert(x))


def _as_inductor(inductor_pass: Any, written: list[str]) -> airstream.CompilerConfig:
    """A config whose post pass calls ``inductor_pass`` as Inductor does (on the post-grad
    graph), noting in ``written`` the graph it leaves, or "same" when it left it as it was."""

    def as_inductor(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        before = str(gm.graph)
        inductor_pass(gm.graph)  # Inductor calls post-grad passes with the graph
        written.append("same" if str(gm.graph) == before else str(gm.graph))

    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = as_inductor
    return config


def _native_graph_then_airstream(
    graph_pass: Any,
) -> tuple[str, Any, Any, torch.nn.Module]:
    """Run ``for_inductor(graph_pass)`` as Inductor would (on the post-grad graph), keep the
    graph it writes, and let airstream run that graph."""
    inductor_pass = for_inductor(graph_pass, on_cpu=True)
    written: list[str] = []
    model = _Moe().eval()
    compiled, backend = compile_model(model, _as_inductor(inductor_pass, written))
    return written, inductor_pass, (compiled, backend), model


def test_the_shared_expert_pass_reaches_inductor_as_native_streams_and_events() -> None:
    written, inductor_pass, (compiled, backend), model = _native_graph_then_airstream(
        passes.shared_expert_overlap()
    )
    x = torch.randn(8, 32)
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (text,) = written
    # what Inductor receives: no air op; the streams ops with registry indices, each inside
    # control_deps as AOTAutograd leaves them (torch 2.13+; 2.11's Inductor takes them bare)
    assert "torch.ops.air" not in text
    for op in ("wait_stream", "record_event", "wait_event"):
        assert f"streams.{op}" in text or f"subgraph_{op}" in text, (op, text)
    (info,) = inductor_pass.written
    assert set(info.streams) == {None, "shared_expert"} and info.records == info.waits
    # airstream, reading that graph, runs the shared expert on the stream the pass made
    graph = graph_of(backend, "inference")
    side = f"stream#{info.streams['shared_expert']}"
    assert graph.streams.side_streams == (side,)
    calls = [n for n in graph.graph_module.graph.nodes if n.op == "call_function"]
    on_side = [n for n in calls if graph.streams.stream(n) == side]
    assert any(n.target is aten.silu.default for n in on_side)


def test_the_native_form_plans_like_the_air_form() -> None:
    """The same model with the pass in airstream's form: the same nodes on a side stream."""
    _, _, (native_compiled, native_backend), model = _native_graph_then_airstream(
        passes.shared_expert_overlap()
    )
    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = passes.shared_expert_overlap()
    air_compiled, air_backend = compile_model(model, config)
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert_same(native_compiled(x), air_compiled(x), rtol=1e-5, atol=1e-5)

    def side_ops(backend: Any) -> list[str]:
        graph = graph_of(backend, "inference")
        calls = [n for n in graph.graph_module.graph.nodes if n.op == "call_function"]
        return sorted(
            str(n.target)
            for n in calls
            if graph.streams.stream(n) is not None and "aten" in str(n.target)
        )

    assert side_ops(native_backend) == side_ops(air_backend) != []


def test_uuid_names_the_pass_and_its_settings() -> None:
    one = for_inductor(passes.auto_streams(max_streams=2))
    again = for_inductor(passes.auto_streams(max_streams=2))
    other = for_inductor(passes.auto_streams(max_streams=3))
    assert one.uuid() == again.uuid() != other.uuid()
    assert "auto_streams" in repr(one)
    assert isinstance(one, torch_internals.custom_graph_pass()[0])


def test_a_graph_without_side_streams_is_handed_on_unchanged() -> None:
    inductor_pass = for_inductor(passes.shared_expert_overlap(), on_cpu=True)  # no match
    seen: list[str] = []
    config = _as_inductor(inductor_pass, seen)
    compiled, _ = compile_model(lambda x: x.sin() @ x, config)
    with torch.no_grad():
        compiled(torch.randn(3, 3))
    assert seen == ["same"]


def test_a_cpu_graph_is_handed_on_unchanged_with_a_warning() -> None:
    inductor_pass = for_inductor(passes.shared_expert_overlap())
    seen: list[str] = []
    config = _as_inductor(inductor_pass, seen)
    compiled, _ = compile_model(_Moe().eval(), config)
    with pytest.warns(UserWarning, match="Inductor's CPU code cannot run streams"):
        with torch.no_grad():
            compiled(torch.randn(4, 32))
    assert seen == ["same"] and inductor_pass.written == []


@slow(
    "Inductor compiles the model's C++ kernels with its cache emptied",
    "tests/test_inductor_pass.py::test_a_cpu_graph_is_handed_on_unchanged_with_a_warning",
)
def test_on_cpu_inductor_gets_the_graph_unchanged_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor's CPU wrapper cannot run streams; the pass says so and steps aside."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no cached graph: a compile
    inductor_pass = for_inductor(passes.shared_expert_overlap())
    model = _Moe().eval()
    compiled = torch.compile(model, options={"post_grad_custom_post_pass": inductor_pass})
    x = torch.randn(4, 32)
    with pytest.warns(UserWarning, match="Inductor's CPU code cannot run streams"):
        with torch.no_grad():
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert inductor_pass.written == []


@pytest.mark.cuda
def test_cuda_inductor_runs_the_pass_on_its_own_streams() -> None:
    model = _Moe().cuda().eval()
    inductor_pass = for_inductor(passes.shared_expert_overlap())
    compiled = torch.compile(model, options={"post_grad_custom_post_pass": inductor_pass})
    x = torch.randn(64, 32, device="cuda")
    with torch.no_grad():
        want = model(x)
        for _ in range(3):
            assert_same(compiled(x), want, rtol=1e-4, atol=1e-4)
    (info,) = inductor_pass.written
    assert "shared_expert" in info.streams


def test_backward_graphs_and_graphs_with_the_models_own_streams_are_left_alone() -> None:
    """Inductor compiles a backward graph at the first backward, after Dynamo's bytecode is
    made, so no stream object could be built for it; a graph with the model's own streams keeps
    them. Both are handed on unchanged, each with a warning saying why."""
    inductor_pass = for_inductor(passes.shared_expert_overlap(), on_cpu=True)
    config = _as_inductor(inductor_pass, [])
    model = _Moe()
    compiled, _ = compile_model(model, config)
    x = torch.randn(4, 32, requires_grad=True)
    with pytest.warns(UserWarning, match="leaves a backward graph as it is"):
        compiled(x).sum().backward()
    assert len(inductor_pass.written) == 1  # the forward graph's

    side = airstream.current_stream("cpu")
    alt = torch.Stream(device="cpu")

    def own_streams(t: torch.Tensor) -> torch.Tensor:
        alt.wait_stream(side)
        with alt:
            y = t.sin()
        side.wait_stream(alt)
        return y + 1

    torch_compiled, _ = compile_model(own_streams, config)
    with pytest.warns(UserWarning, match="torch.Stream blocks or events as it is"):
        with torch.no_grad():
            torch_compiled(torch.ones(3))
