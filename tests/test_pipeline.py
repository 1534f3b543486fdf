"""One graph's pipeline: observers cannot steer it, the module is recompiled once, each node's
stream is written once at the end of the passes and read by every later stage, a pass knows
which graph it is on, and a wait placed before its record is refused in words."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, cause_of, compile_model, graph_of

import airstream
import airstream.compiler.finish
import airstream.compiler.pipeline
import airstream.graph.streams
import airstream.torch_internals
from airstream import PassError, passes
from airstream.debug.observers import CompileObserver
from airstream.errors import AirstreamError
from airstream.passes.manager import PassSpec

air = torch.ops.air


class _Branches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = torch.nn.Linear(8, 8)
        self.right = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.left(x)) + torch.sigmoid(self.right(x))


def _right_on_side(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    passes.place_on_stream(gm, passes.select_nodes(gm, module=r"^right$"), "side")


def _config() -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _right_on_side
    return config


class _Steering(CompileObserver):
    """Tries to move the model's first op onto a stream before the built-in passes run."""

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        first = next(n for n in gm.graph.nodes if n.op == "call_function")
        airstream.torch_internals.set_annotations(first, {"air_stream": "stolen"})


class _Looking(CompileObserver):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self.seen.append(f"{graph_kind}:{spec.name}:{len(gm.graph.nodes)}")


def test_an_observer_cannot_change_a_compile() -> None:
    model, x = _Branches(), torch.randn(4, 8)
    plain = airstream.get_backend(compiler_config=_config())
    looking = _Looking()
    watched = airstream.get_backend(compiler_config=_config(), observers=[looking])
    with torch.no_grad():
        want = model(x)
        assert_same(torch.compile(model, backend=plain)(x), want)
        torch.compiler.reset()
        assert_same(torch.compile(model, backend=watched)(x), want)
    assert looking.seen  # it saw every pass
    a, b = graph_of(plain, "inference"), graph_of(watched, "inference")
    assert dict(a.streams.stream_of) == dict(b.streams.stream_of)
    assert str(a.plan) == str(b.plan)

    torch.compiler.reset()
    steering = airstream.get_backend(compiler_config=_config(), observers=[_Steering()])
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(model, backend=steering)(x)
    error = cause_of(info.value, AirstreamError)
    assert error is not None
    assert "observer _Steering changed the graph in before_pass" in str(error)
    assert "write a pass" in str(error)
    assert not steering.graphs  # nothing compiled with the stolen stream


def test_the_module_is_recompiled_once_per_pipeline() -> None:
    """From the first custom post pass on (three passes, two of them built-ins here), the
    pipeline regenerates the module's code once, at its end."""
    received: list[torch.fx.GraphModule] = []
    calls: list[str] = []

    def watch(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        original = gm.recompile

        def counting() -> Any:
            calls.append(graph_kind)
            return original()

        graph_kind = passes.graph_kind(gm)
        gm.recompile = counting  # type: ignore[method-assign]
        received.append(gm)

    def keep(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        received.append(gm)

    config = _config()
    config.post_grad_custom_post_pass = [watch, keep]
    config.experimental_config.reinplace_inplaceable_ops = True
    compiled, backend = compile_model(_Branches(), config)
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    gm = received[0]
    assert all(g is gm for g in received)
    assert len(graph_of(backend, "inference").passes) >= 5
    assert calls == ["inference"]
    assert "sigmoid" in gm.code  # the one recompile shows the graph that runs


def test_the_streams_are_written_once_and_every_later_stage_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the end of the passes each node's stream is written into its key, once; the final
    passes (reinplace), the planner, max-autotune's fusion and the dumps read it from there, and
    a node a later stage added without one is an error that names it."""
    from airstream.graph.streams import STREAM_KEY, assign_streams

    written: list[int] = []
    original = airstream.graph.streams.lower_streams

    def counting(gm: torch.fx.GraphModule, **kwargs: Any) -> Any:
        if not airstream.graph.streams.is_lowered(gm):
            written.append(len(gm.graph.nodes))
        return original(gm, **kwargs)

    monkeypatch.setattr(airstream.compiler.pipeline, "lower_streams", counting)
    monkeypatch.setattr(airstream.compiler.finish, "lower_streams", counting)
    config = _config()
    config.experimental_config.reinplace_inplaceable_ops = True
    config.experimental_config.reinplace_input_mutations = True
    compiled, backend = compile_model(_Branches(), config)
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    graph = graph_of(backend, "inference")
    assert len(written) == 1, "lowered once, at the end of the passes"
    gm = graph.graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert all(STREAM_KEY in n.meta for n in calls)
    assert {n.meta[STREAM_KEY] for n in calls} == {None, "side"}
    assert dict(assign_streams(gm).stream_of) == {n.name: n.meta[STREAM_KEY] for n in calls}
    # a stage after the passes that adds a node without its key is caught, by name
    first = calls[0]
    with gm.graph.inserting_after(first):
        stray = gm.graph.call_function(torch.ops.aten.neg.default, (first,))
    with pytest.raises(AirstreamError, match=f"{stray.name}.*has no stream"):
        assign_streams(gm)


def test_a_pass_knows_which_graph_it_is_on() -> None:
    kinds: list[str] = []

    def note(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        kinds.append(passes.graph_kind(gm))

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = note
    model = _Branches()
    compiled, _ = compile_model(model, config)
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    assert kinds == ["inference"]
    kinds.clear()
    torch.compiler.reset()
    compiled, _ = compile_model(model, config)
    compiled(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert kinds == ["forward", "backward"]


def _wait_first(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_before(first):
        waiting = graph.call_function(air.wait.default, ([],))
    with graph.inserting_after(first):
        token = graph.call_function(air.record.default, ())
    waiting.args = ([token],)


def test_a_wait_before_its_record_is_refused_in_words() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _wait_first
    compiled, _ = compile_model(_Branches(), config)
    with pytest.raises(Exception) as info, torch.no_grad():
        compiled(torch.randn(4, 8))
    error = cause_of(info.value, PassError)
    assert error is not None
    message = str(error)
    assert "_wait_first" in message
    assert "node 'wait_default' (air.wait.default)" in message
    assert "waits for the record node 'record_default'" in message
    assert "comes after it in the graph" in message
    assert "inserting_after(record_default)" in message
    assert "used before it has been defined" not in message
