"""The backend end to end: the guide's example, pass stages, registration, dynamic shapes."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, count, graph_of, targets

import airstream
from airstream.backend import registered_backend
from airstream.examples.guide import Model, custom_pre_pass
from airstream.torch_internals import FakeTensor, aot_module_simplified, lookup_backend

air = torch.ops.air
aten = torch.ops.aten


def _guide_config() -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    return config


def test_design_example_streams_and_numerics() -> None:
    compiled, backend = compile_model(Model(), _guide_config())
    x = torch.randn(8, 8)
    assert_same(compiled(x), Model()(x))

    graph = graph_of(backend, "inference")
    gm, streams = graph.graph_module, graph.streams
    by_target = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    assert streams.stream(by_target[aten.mm.default]) == "stream_1"
    assert streams.stream(by_target[aten.abs.default]) == "stream_1"
    assert streams.stream(by_target[aten.add.Tensor]) is None
    assert streams.stream(by_target[aten.sub.Tensor]) is None
    record, wait = by_target[air.record.default], by_target[air.wait.default]
    assert streams.stream(record) == "stream_1" and streams.stream(wait) is None
    assert wait.args[0] == [record]
    order = list(gm.graph.nodes)
    assert order.index(wait) < order.index(by_target[aten.sub.Tensor])
    assert streams.streams == (None, "stream_1")


def test_markers_survive_in_order_exactly_once() -> None:
    compiled, backend = compile_model(Model(), _guide_config())
    compiled(torch.randn(4, 4))
    gm = graph_of(backend, "inference").graph_module
    air_ops = [t for t in targets(gm) if t.namespace == "air"]
    assert air_ops == [
        air.scope_enter.default,
        air.record.default,
        air.scope_exit.default,
        air.wait.default,
    ]


def test_pass_receives_graph_module_fake_inputs_and_the_config() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    def spy(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
        seen.append((gm, list(example_inputs), config))

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = spy
    compiled, _ = compile_model(Model(), config)
    compiled(torch.randn(3, 3))
    assert len(seen) == 1
    gm, inputs, got_config = seen[0]
    assert isinstance(gm, torch.fx.GraphModule)
    assert inputs and all(isinstance(t, FakeTensor) for t in inputs)
    assert got_config is config


class _NoopAndDuplicate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.relu().view(x.shape)  # a no-op view
        b = x.relu()  # a duplicate of the first relu
        return a + b


def test_pre_runs_before_builtins_and_post_after() -> None:
    log: list[tuple[str, int, int]] = []

    def snapshot(stage: str) -> Any:
        def observe(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
            log.append((stage, count(gm, aten.view.default), count(gm, aten.relu.default)))

        return observe

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = [snapshot("pre1"), snapshot("pre2")]
    config.post_grad_custom_post_pass = snapshot("post")
    compiled, _ = compile_model(_NoopAndDuplicate(), config)
    x = torch.randn(4, 5)
    assert_same(compiled(x), _NoopAndDuplicate()(x))
    # pre passes (in list order) see the no-op view and both relus; the post pass sees the
    # graph after remove_noop_ops and CSE.
    assert log == [("pre1", 1, 2), ("pre2", 1, 2), ("post", 0, 1)]


def test_training_runs_pipeline_on_forward_and_backward() -> None:
    kinds: list[bool] = []

    def note(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        kinds.append(
            any(n.name.startswith("tangents") for n in gm.graph.find_nodes(op="placeholder"))
        )

    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = note
    lin = torch.nn.Linear(4, 3)
    compiled, backend = compile_model(lin, config)
    x = torch.randn(2, 4)
    compiled(x).sum().backward()
    assert [g.kind for g in backend.graphs] == ["forward", "backward"]
    assert kinds == [False, True]
    with torch.no_grad():
        compiled(x)
    assert backend.graphs[-1].kind == "inference"


def test_dynamic_shapes_second_batch_size() -> None:
    compiled, backend = compile_model(Model(), _guide_config())
    for n in (4, 6, 9):
        x = torch.randn(n, n)
        assert_same(compiled(x), Model()(x))
    last = graph_of(backend, "inference").graph_module
    placeholders = [n.meta["val"] for n in last.graph.find_nodes(op="placeholder")]
    assert any(isinstance(v, torch.SymInt) for v in placeholders), "recompiled with dynamic dims"
    assert count(last, air.scope_enter.default) == 1


def test_explicitly_dynamic_compile() -> None:
    compiled, _ = compile_model(Model(), _guide_config(), dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, n)
        assert_same(compiled(x), Model()(x))


def test_registered_backend_name_with_options() -> None:
    seen = []
    opt = torch.compile(
        Model(),
        backend="airstream",
        options={
            "debug.run_eagerly": True,
            "post_grad_custom_pre_pass": [custom_pre_pass, lambda gm, i, c: seen.append(c)],
        },
    )
    x = torch.randn(5, 5)
    assert_same(opt(x), Model()(x))
    assert len(seen) == 1 and seen[0].debug.run_eagerly is True


def test_registered_backend_rejects_unknown_option() -> None:
    opt = torch.compile(Model(), backend="airstream", options={"debug.run_eagrly": True})
    with pytest.raises(Exception) as info:
        opt(torch.randn(2, 2))
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or getattr(exc, "inner_exception", None)
    config_errors = [e for e in chain if isinstance(e, airstream.ConfigError)]
    assert config_errors, chain
    assert "did you mean 'debug.run_eagerly'" in str(config_errors[0]).lower()


def test_entry_point_resolves_to_registered_backend() -> None:
    assert lookup_backend("airstream") is registered_backend


def test_get_compiler_with_aot_module_simplified() -> None:
    calls: list[str] = []
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = [custom_pre_pass, lambda gm, i, c: calls.append("pre")]
    compiler = airstream.get_compiler(config)

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler)

    opt = torch.compile(Model(), backend=backend)
    x = torch.randn(4, 4)
    assert_same(opt(x), Model()(x))
    assert calls == ["pre"]


def test_get_npu_backend_is_alias() -> None:
    assert airstream.get_npu_backend is airstream.get_backend


class _MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        x.add_(1)
        return y + x


def test_input_mutation_kept_in_graph_and_matches_eager() -> None:
    compiled, backend = compile_model(_MutatesInput())
    x = torch.randn(4)
    x_eager = x.clone()
    with torch.no_grad():
        got = compiled(x)
    want = _MutatesInput()(x_eager)
    assert_same(got, want)
    assert_same(x, x_eager)
    gm = graph_of(backend, "inference").graph_module
    assert count(gm, aten.copy_.default) == 1, "keep_inference_input_mutations keeps the copy_"


def test_max_autotune_runs_without_warning() -> None:
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"
    compiled, backend = compile_model(Model(), config)
    x = torch.randn(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a segment falling back to aten code warns
        assert_same(compiled(x), Model()(x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert graph.segments and graph.fallbacks == 0, [s.describe() for s in graph.segments]
    assert all(s.kernels for s in graph.segments)


def test_single_stream_ignores_labels() -> None:
    config = _guide_config()
    config.ge_config.enable_single_stream = True
    compiled, backend = compile_model(Model(), config)
    x = torch.randn(3, 3)
    assert_same(compiled(x), Model()(x))
    streams = graph_of(backend, "inference").streams
    assert set(streams.stream_of.values()) == {None} and streams.streams == (None,)


def test_observers_receive_compile_events_and_bad_ones_are_named() -> None:
    from airstream.debug.observers import CompileObserver

    events: list[str] = []

    class Recorder(CompileObserver):
        def graph_traced(self, gm: torch.fx.GraphModule) -> None:
            events.append("traced")

        def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
            events.append(f"{graph_kind}:{stage}")

        def graph_compiled(self, compiled: Any) -> None:
            assert "def forward" in compiled.executor.code
            events.append(f"{compiled.kind}:compiled")

    backend = airstream.get_backend(_guide_config(), observers=[Recorder()])
    compiled = torch.compile(Model(), backend=backend)
    x = torch.randn(3, 3)
    assert_same(compiled(x), Model()(x))
    assert events == [
        "traced",
        "inference:post_grad_custom_pre_pass",
        "inference:builtin",  # no post pass configured: that stage does not run
        "inference:compiled",
    ]
    with pytest.raises(TypeError, match=r"observers\[0\] must be an airstream.debug.observers"):
        airstream.get_backend(observers=[print])  # type: ignore[list-item]


def test_an_observer_written_for_plan_built_is_still_called_with_a_warning() -> None:
    from airstream.debug.observers import CompileObserver

    seen: list[str] = []

    class Old(CompileObserver):
        def plan_built(self, graph_kind: str, gm: Any, streams: Any, plan: Any, code: str) -> None:
            assert "def forward" in code and plan.streams
            seen.append(graph_kind)

    with pytest.warns(FutureWarning, match="Old defines plan_built, which is now part of"):
        backend = airstream.get_backend(_guide_config(), observers=[Old()])
    compiled = torch.compile(Model(), backend=backend)
    x = torch.randn(3, 3)
    assert_same(compiled(x), Model()(x))
    assert seen == ["inference"]


def test_compile_options_apply_to_a_backend_instance() -> None:
    backend = airstream.get_backend()
    compiled = torch.compile(
        lambda x: x.cos(), backend=backend, options={"debug.run_eagerly": True}
    )
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x.cos())
    assert type(backend.graphs[-1].executor).__name__ == "SerialExecutor"
    assert backend.config.debug.run_eagerly is False, "the backend's own config is unchanged"
    torch.compiler.reset()
    bad = torch.compile(lambda x: x.cos(), backend=backend, options={"debug.run_eagrly": True})
    with pytest.raises(Exception, match="Did you mean 'debug.run_eagerly'"):
        bad(x)
