"""Port of TorchAir's reduce-overhead (aclgraph) ST tests: tests/st/torchair_aclgraph_st.py.

Upstream runs these against stubbed NPU graphs and asserts TorchAir's DEBUG log lines or patches
its private graph classes. Here every test compares with eager PyTorch and checks what airstream
exposes instead: the optimized graph (``backend.graphs[i].graph_module``), which stream runs each
node (``.streams``), the ordering edges of the plan (``.plan.syncs`` / ``.plan.stream(label)``),
the inputs after a call (mutations), and how many graphs Dynamo compiled. Each test says in one
comment what upstream asserted and what this port checks. The upstream tests left out (private
TorchAir modules, NPU graph internals, GE, cache_compile files) go to tests/torchair/not_ported.csv.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
from tests.torchair.conftest import capture_logger, capture_warnings, upstream
from torchair.configs.compiler_config import CompilerConfig
from torchair.core.utils import logger

import torchair
from airstream.backend import AirstreamBackend, CompiledGraph
from airstream.graph.effects import effects
from airstream.runtime.serial import SerialExecutor

aten = torch.ops.aten
air = torch.ops.air

# The options upstream sets on nearly every reduce-overhead config (no effect off the NPU).
CLONE_OFF = {"debug.aclgraph.clone_input": False}
UPSTREAM_USUAL = {
    "debug.aclgraph.clone_input": False,
    "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": True,
}


# ---------------------------------------------------------------------------------------------
# helpers


def _config(options: dict[str, Any] | None = None, mode: str = "reduce-overhead") -> CompilerConfig:
    """A TorchAir config in ``mode`` with the dotted ``options`` set."""
    config = CompilerConfig()
    config.mode = mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NPU-only options warn once per process
        for path, value in (options or {}).items():
            *groups, leaf = path.split(".")
            owner: Any = config
            for group in groups:
                owner = getattr(owner, group)
            setattr(owner, leaf, value)
    return config


def _compile(
    model: Callable[..., Any],
    options: dict[str, Any] | None = None,
    mode: str = "reduce-overhead",
    **compile_kwargs: Any,
) -> tuple[Callable[..., Any], AirstreamBackend]:
    backend = torchair.get_npu_backend(compiler_config=_config(options, mode))
    return torch.compile(model, backend=backend, **compile_kwargs), backend


def _compiled_graphs(backend: AirstreamBackend) -> list[CompiledGraph]:
    """The graphs Dynamo handed to the backend (inference or training forward; no backward)."""
    return [g for g in backend.graphs if g.kind != "backward"]


def _last(backend: AirstreamBackend) -> CompiledGraph:
    graphs = _compiled_graphs(backend)
    assert graphs, "nothing was compiled"
    return graphs[-1]


def _nodes(graph: CompiledGraph, target: Any) -> list[torch.fx.Node]:
    """The nodes calling ``target`` in the optimized graph, in graph order."""
    return [
        n for n in graph.graph_module.graph.nodes if n.op == "call_function" and n.target is target
    ]


def _targets(graph: CompiledGraph) -> set[Any]:
    return {n.target for n in graph.graph_module.graph.nodes if n.op == "call_function"}


def _stream(graph: CompiledGraph, node: torch.fx.Node) -> str | None:
    return graph.streams.stream_of[node.name]


def _writes_input(graph: CompiledGraph) -> bool:
    """Whether the optimized graph writes one of its inputs (a copy_ back or an in-place op)."""
    return any(
        w.op == "placeholder" for n in graph.graph_module.graph.nodes for w in effects(n).writes
    )


def _copies_back(graph: CompiledGraph) -> bool:
    """Whether the optimized graph copies a result back into one of its inputs (copy_)."""
    return any(
        isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"
        for n in _nodes(graph, aten.copy_.default)
    )


def _close(got: Any, want: Any) -> None:
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _close(g, w)
    else:
        torch.testing.assert_close(got, want)


def _clone(args: tuple[Any, ...]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _same_as_eager(compiled: Callable[..., Any], eager: Callable[..., Any], *args: Any) -> Any:
    """Run ``compiled`` on ``args`` and ``eager`` on copies; outputs and inputs must agree."""
    ref = _clone(args)
    got = compiled(*args)
    want = eager(*ref)
    _close(got, want)
    for a, r in zip(args, ref, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, r)
    return got


@pytest.fixture
def debug_logger() -> Any:
    """TorchAir's logger at DEBUG (upstream sets this for the whole module)."""
    saved = logger.level
    logger.setLevel(logging.DEBUG)
    yield logger
    logger.setLevel(saved)


def _randn(*shape: int, n: int = 4, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(*shape, dtype=dtype) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# capture and replay


class _TwoLinear(torch.nn.Module):
    def __init__(self, features: int = 2) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(features, features)
        self.linear2 = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear1(x) + self.linear2(x)


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_capture_and_replay")
def test_aclgraph_capture_and_replay() -> None:
    # upstream: two calls of a compiled model run (no assertion); port: both match eager and the
    # second call replays the first compile
    model = _TwoLinear()
    compiled, backend = _compile(model, UPSTREAM_USUAL, dynamic=False)
    x = torch.randn(3, 2)
    for _ in range(2):
        _same_as_eager(compiled, model, x)
    assert len(_compiled_graphs(backend)) == 1


class _MulInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_true"
)
def test_aclgraph_capture_and_replay_keep_inference_input_mutations_true() -> None:
    # upstream: a mutated input at a new address logs "needs to be recaptured"; port: the write
    # lands in each new input (not the warm-up one), in-graph (copy_ into the input), 1 compile
    compiled, backend = _compile(
        _MulInPlace(),
        {**CLONE_OFF, "experimental_config.keep_inference_input_mutations": True},
        dynamic=False,
    )
    warm = torch.randn(3, 2)
    x = warm.clone()
    _same_as_eager(compiled, _MulInPlace(), warm)
    after_warmup = warm.clone()
    for _ in range(2):
        _same_as_eager(compiled, _MulInPlace(), x)
    torch.testing.assert_close(warm, after_warmup)  # the warm-up input is not written again
    assert len(_compiled_graphs(backend)) == 1
    assert _writes_input(_last(backend))


class _DivInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.div_(2)
        return x - 1


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_false"
)
def test_aclgraph_capture_and_replay_keep_inference_input_mutations_false() -> None:
    # upstream: replays with keep_inference_input_mutations=False call no Logger.warning; port:
    # the same, plus the mutation reaches the input and is done outside the graph (no copy_)
    compiled, backend = _compile(
        _DivInPlace(),
        {**UPSTREAM_USUAL, "experimental_config.keep_inference_input_mutations": False},
        dynamic=False,
    )
    warm = torch.randn(3, 2)
    x = warm.clone()
    _same_as_eager(compiled, _DivInPlace(), warm)
    with mock.patch("logging.Logger.warning") as warning:
        for _ in range(2):
            _same_as_eager(compiled, _DivInPlace(), x)
    warning.assert_not_called()
    assert not _writes_input(_last(backend))


# ---------------------------------------------------------------------------------------------
# dynamic shapes


class _ThreeByThree(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(3, 3)
        self.linear2 = torch.nn.Linear(3, 3)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.linear1(inp) + self.linear2(inp)


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_dynamic_sym_in_tensor")
def test_aclgraph_dynamic_sym_in_tensor() -> None:
    # upstream: a second batch size runs through the same compiled model object; port: both sizes
    # match eager from a single dynamic compile
    model = _ThreeByThree()
    compiled, backend = _compile(model, UPSTREAM_USUAL, dynamic=True)
    _same_as_eager(compiled, model, torch.randn(4, 3))
    _same_as_eager(compiled, model, torch.randn(5, 3))
    assert len(_compiled_graphs(backend)) == 1


class _LinearAndScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(2, 2)
        self.linear2 = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, s: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear1(x), torch.add(self.linear2(x), s)


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_dynamic_sym_in_scale_and_tensor")
def test_aclgraph_dynamic_sym_in_scale_and_tensor() -> None:
    # upstream: per (scale, shape) key an NPU graph is captured or found in the same FX graph,
    # and a float scale after a reset is a new FX graph; port: int scales 4/5 and a new batch size
    # share one compile, the float scale after reset compiles again, all match eager
    model = _LinearAndScale()
    compiled, backend = _compile(
        model, {**UPSTREAM_USUAL, "debug.aclgraph.enable_output_clone": True}, dynamic=True
    )
    x = torch.randn(5, 2)
    with torch.no_grad():
        _same_as_eager(compiled, model, x, 4)
        _same_as_eager(compiled, model, x, 5)
        _same_as_eager(compiled, model, x, 4)
        x2 = torch.randn(6, 2)
        _same_as_eager(compiled, model, x2, 4)
        assert len(_compiled_graphs(backend)) == 1
        torch.compiler.reset()
        _same_as_eager(compiled, model, x2, 5.0)
    assert len(_compiled_graphs(backend)) == 2


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_aclgraph_dynamic_output_construct_in_share_memory"
)
def test_aclgraph_dynamic_output_construct_in_share_memory() -> None:
    # upstream: outputs are rebuilt ("After reconstructing fx_graph") when another shape reuses the
    # memory pool; port: an output stays valid (= eager) after later calls of other and same shapes
    model = torch.nn.Linear(2, 2)
    compiled, _ = _compile(model, UPSTREAM_USUAL, dynamic=True)
    x, y = torch.randn(4, 2), torch.randn(5, 2)
    with torch.no_grad():
        want_x, want_y = model(x), model(y)
        res_x = compiled(x)
        res_y = compiled(y)
        torch.testing.assert_close(res_x, want_x)
        res_y2 = compiled(y)
        torch.testing.assert_close(res_y, want_y)
        del res_y
        torch.testing.assert_close(compiled(y), want_y)
        torch.testing.assert_close(res_y2, want_y)
        torch.testing.assert_close(res_x, want_x)


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_not_assert_size_stride_empty_tensor")
def test_aclgraph_not_assert_size_stride_empty_tensor() -> None:
    # upstream: no assert_size_stride is generated for an empty input; port: a zero-size input
    # compiles dynamically and gives eager's (empty) result
    def double(x: torch.Tensor) -> torch.Tensor:
        return x + x

    compiled, _ = _compile(double, UPSTREAM_USUAL, dynamic=True)
    out = _same_as_eager(compiled, double, torch.randn(0, 512, 1, 64))
    assert out.shape == (0, 512, 1, 64)


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_supported_blocking_env")
def test_aclgraph_supported_blocking_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # upstream: with ASCEND_LAUNCH_BLOCKING=1 both shapes log "Success to capture"; port: with the
    # variable both shapes compile (static: one graph each) and match eager
    def double(x: torch.Tensor) -> torch.Tensor:
        return x + x

    monkeypatch.setenv("ASCEND_LAUNCH_BLOCKING", "1")
    compiled, backend = _compile(double, UPSTREAM_USUAL, dynamic=False)
    _same_as_eager(compiled, double, torch.randn(4, 2))
    _same_as_eager(compiled, double, torch.randn(5, 2))
    assert len(_compiled_graphs(backend)) == 2  # static: one compile per shape


# ---------------------------------------------------------------------------------------------
# recapture on address changes (inputs and parameters)


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_recapture_non_mutated_input_with_address_change_and_input_with_no_address_change"
)
def test_aclgraph_recapture_non_mutated_input_with_address_change() -> None:
    # upstream: a read-only input at a new address needs no recapture ("no needs to be
    # recaptured", "Find captured AclGraph"); port: the new tensor's values are used, no recompile
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiled, backend = _compile(add_one, UPSTREAM_USUAL, dynamic=True)
    warm = torch.randn(3, 2)
    x = warm.clone()
    _same_as_eager(compiled, add_one, warm)
    x.add_(10)  # same shape, new address, new values
    _same_as_eager(compiled, add_one, x)
    _same_as_eager(compiled, add_one, x)
    assert len(_compiled_graphs(backend)) == 1


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_aclgraph_recapture_mutated_input_with_address_change"
)
def test_aclgraph_recapture_mutated_input_with_address_change() -> None:
    # upstream: a mutated input at a new address logs "needs to be recaptured"; port: each call
    # writes its own input (dynamic compile), once
    compiled, backend = _compile(_MulInPlace(), UPSTREAM_USUAL, dynamic=True)
    warm = torch.randn(3, 2)
    x = warm.clone()
    _same_as_eager(compiled, _MulInPlace(), warm)
    _same_as_eager(compiled, _MulInPlace(), x)
    torch.testing.assert_close(x, warm)  # both written exactly once
    assert len(_compiled_graphs(backend)) == 1


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_aclgraph_recapture_multi_graph_with_address_change"
)
def test_aclgraph_recapture_multi_graph_with_address_change() -> None:
    # upstream: new shapes capture new NPU graphs, then a copy of the first input recaptures; port:
    # every call writes its own input and matches eager across shapes, then the copy does too
    compiled, backend = _compile(_MulInPlace(), UPSTREAM_USUAL, dynamic=True)
    x, y, z = torch.ones(3, 2), torch.ones(4, 2), torch.ones(2, 1)
    x_copy = x.clone()
    for t in (x, y, z):
        _same_as_eager(compiled, _MulInPlace(), t)
    _same_as_eager(compiled, _MulInPlace(), x_copy)
    torch.testing.assert_close(x_copy, torch.full((3, 2), 2.0))
    torch.testing.assert_close(x, torch.full((3, 2), 2.0))
    # [3,2] and [4,2] share the dynamic graph; a size-1 dim is specialized by Dynamo
    assert 1 <= len(_compiled_graphs(backend)) <= 2


def _swap_weights_check(options: dict[str, Any]) -> None:
    model = torch.nn.Linear(2, 2)
    compiled, backend = _compile(model, options, dynamic=True)
    x = torch.randn(3, 2)
    model.weight.data = torch.ones(2, 2)
    _same_as_eager(compiled, model, x)
    model.weight.data = torch.zeros(2, 2)  # a new parameter tensor
    out = _same_as_eager(compiled, model, x)
    torch.testing.assert_close(out, model.bias.expand(3, 2))
    _same_as_eager(compiled, model, x)
    assert len(_compiled_graphs(backend)) == 1


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_aclgraph_recapture_with_parameter_address_change",
)
def test_aclgraph_recapture_with_parameter_address_change() -> None:
    # upstream: swapping weight.data does not log "needs to be recaptured"; port: the swap is seen
    # (output = eager with the new weight) without recompiling
    _swap_weights_check(UPSTREAM_USUAL)


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_recapture_with_parameter_address_change_with_frozen_parameter"
)
def test_aclgraph_recapture_with_parameter_address_change_with_frozen_parameter() -> None:
    # upstream: with frozen_parameter a weight swap logs "no needs to be recaptured"; port: the
    # option is accepted, the swap needs no recompile, outputs match eager
    _swap_weights_check({**UPSTREAM_USUAL, "experimental_config.frozen_parameter": True})


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_userinput_construct_in_share_memory_with_frozen_parameter"
)
def test_aclgraph_userinput_construct_in_share_memory_with_frozen_parameter() -> None:
    # upstream: same as the frozen-parameter recapture test (log "no needs to be recaptured");
    # port: a weight swap with frozen_parameter needs no recompile and matches eager
    _swap_weights_check({**UPSTREAM_USUAL, "experimental_config.frozen_parameter": True})


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_userinput_construct_in_share_memory_with_no_frozen_parameter"
)
def test_aclgraph_userinput_construct_in_share_memory_with_no_frozen_parameter() -> None:
    # upstream: a weight swap without frozen_parameter does not log "needs to be recaptured";
    # port: the swap is seen without recompiling
    _swap_weights_check(UPSTREAM_USUAL)


class _MutateThenMatmul(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        x = x @ self.linear(y)
        return x + 1


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_userinput_construct_in_share_memory_with_parameter_and_mutated"
)
def test_aclgraph_userinput_construct_in_share_memory_with_parameter_and_mutated() -> None:
    # upstream: logs for output rebuild, recapture on a new mutated input, none on a weight swap,
    # and recapture after the last output is freed; port: every step's outputs and written inputs
    # match eager (same module), earlier outputs stay valid, one dynamic compile
    model = _MutateThenMatmul()
    compiled, backend = _compile(
        model,
        {**UPSTREAM_USUAL, "experimental_config.keep_inference_input_mutations": True},
        dynamic=True,
    )
    x, c = torch.ones(3, 2), torch.ones(2, 2)
    x_copy = x.clone()
    model.linear.weight.data = torch.ones(2, 2)
    first = _same_as_eager(compiled, model, x, c).detach().clone()
    _same_as_eager(compiled, model, torch.randn(5, 2), c)
    _same_as_eager(compiled, model, x_copy, c)
    model.linear.weight.data = torch.zeros(2, 2)
    last = _same_as_eager(compiled, model, x_copy, c)
    del last
    again = _same_as_eager(compiled, model, x, c)
    assert not torch.equal(again, first)  # new weights, twice-doubled input
    assert len(_compiled_graphs(backend)) == 1


# ---------------------------------------------------------------------------------------------
# graph dumps


def _dumps(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.startswith("dynamo_o") and f.endswith(".py"))


@upstream("tests/st/torchair_aclgraph_st.py::test_graph_dump_with_py")
def test_graph_dump_with_py(tmp_path: Any) -> None:
    # upstream: the newest dynamo_o*.py dump holds "torch.ops.aten.add.Tensor(arg0_1, 1)" and
    # "code: return x + 1"; port: both dumps exist under TorchAir's names (checked first), then
    # the same two strings in the optimized (newest) dump
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiled, _ = _compile(
        add_one,
        {**UPSTREAM_USUAL, "debug.graph_dump.type": "py", "debug.graph_dump.path": str(tmp_path)},
    )
    x = torch.randn(2, 2)
    _same_as_eager(compiled, add_one, x)
    names = _dumps(str(tmp_path))
    pattern = re.compile(r"dynamo_(original|optimized)_graph_(\d+)_rank_0_pid_(\d+)_ts_\d+\.py")
    matches = [pattern.fullmatch(n) for n in names]
    assert len(names) == 2 and all(matches), names
    assert {m.group(1) for m in matches if m} == {"original", "optimized"}
    assert len({m.group(2) for m in matches if m}) == 1  # one graph id
    original = next(n for n in names if "original" in n)
    assert "code: return x + 1" in (tmp_path / original).read_text()
    newest = (tmp_path / next(n for n in names if "optimized" in n)).read_text()
    assert "torch.ops.aten.add.Tensor(arg0_1, 1)" in newest
    assert "code: return x + 1" in newest


def test_graph_dump_with_py_names_the_scripts_line_under_the_device_mode(tmp_path: Any) -> None:
    """The same, with the device mode `airstream run --torchair` installs: Dynamo traces through
    its __torch_function__, whose frame must not be the line the dumps (and errors) name."""
    from airstream.compat.torchair.install import install, uninstall
    from airstream.graph.nodes import describe

    uninstall()
    install(verbose=False)  # device_mode=True, as `airstream run --torchair` installs it

    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiled, backend = _compile(
        add_one,
        {**UPSTREAM_USUAL, "debug.graph_dump.type": "py", "debug.graph_dump.path": str(tmp_path)},
    )
    _same_as_eager(compiled, add_one, torch.randn(2, 2))
    names = _dumps(str(tmp_path))
    assert len(names) == 2, names
    for name in names:
        text = (tmp_path / name).read_text()
        assert "code: return x + 1" in text, text
        assert "install.py" not in text, text
    (graph,) = backend.graphs
    (add,) = [n for n in graph.graph_module.graph.nodes if n.target == torch.ops.aten.add.Tensor]
    assert describe(add).endswith("`return x + 1`"), describe(add)


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_unsupported_dump")
def test_aclgraph_unsupported_dump(tmp_path: Any) -> None:
    # upstream: a pbtxt dump in aclgraph mode raises RuntimeError "Graph dump for aclGraph only
    # support 'py' type, but got: pbtxt"; port: the same error on the first call
    def minus_one(x: torch.Tensor) -> torch.Tensor:
        return x - 1.0

    compiled, _ = _compile(
        minus_one,
        {**CLONE_OFF, "debug.graph_dump.type": "pbtxt", "debug.graph_dump.path": str(tmp_path)},
        dynamic=False,
    )
    with pytest.raises(RuntimeError) as info:
        compiled(torch.randn(3, 2))
    assert "Graph dump for aclGraph only support 'py' type, but got: pbtxt" in str(info.value)


# ---------------------------------------------------------------------------------------------
# multiple streams, tagged events, record / wait


class _NestedSwitch(torch.nn.Module):
    def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> tuple[torch.Tensor, ...]:
        add_result = torch.add(in1, in2)
        with torchair.scope.npu_stream_switch("1", 3):
            mm_result1 = torch.mm(in3, in4)
            with torchair.scope.npu_stream_switch("2", 3):
                mm_result2 = torch.mm(in3, in4)
        return add_result, mm_result1, mm_result2


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_stream_switch_with_stream_closure")
def test_npu_stream_switch_with_stream_closure() -> None:
    # upstream: the closure pass adds tagged record/wait pairs so each side stream rejoins the
    # capture stream; port: mm/mm_1 run on streams 1/2, and the main stream waits for each side
    # stream before the graph's output
    compiled, backend = _compile(_NestedSwitch(), UPSTREAM_USUAL, fullgraph=True, dynamic=False)
    x = torch.randn(3, 3)
    with torch.no_grad():
        _same_as_eager(compiled, _NestedSwitch(), x, x, x, x)
    graph = _last(backend)
    mm, mm_1 = _nodes(graph, aten.mm.default)
    assert (_stream(graph, mm), _stream(graph, mm_1)) == ("1", "2")
    assert _stream(graph, _nodes(graph, aten.add.Tensor)[0]) is None
    assert graph.streams.priorities == {"1": 3, "2": 3}
    joins = {
        s.producer_stream
        for s in graph.plan.syncs
        if s.consumer.op == "output" and s.consumer_stream is None
    }
    assert joins == {"1", "2"}


def _tagged_event_model(first: Any, second: Any) -> torch.nn.Module:
    class Model(torch.nn.Module):
        def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> tuple[torch.Tensor, ...]:
            add_result = torch.add(in1, in2)
            torchair.ops.npu_tagged_event_record(first)
            torchair.ops.npu_tagged_event_record(second)
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.ops.npu_tagged_event_wait(first)
                mm_result1 = torch.mm(in3, in4)
                with torchair.scope.npu_stream_switch("2", 3):
                    torchair.ops.npu_tagged_event_wait(second)
                    mm_result2 = torch.mm(in3, in4)
            return add_result, mm_result1, mm_result2

    return Model()


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_stream_switch_with_tagged_event")
def test_npu_stream_switch_with_tagged_event() -> None:
    # upstream: each mm directly follows a tagged_event_wait, 5 tagged records (2 user + 3
    # closure); port: each tagged wait became a control edge from the main stream into stream 1/2
    # that precedes that stream's mm, the 2 user records stay, no tagged wait is left
    first = torchair.ops.npu_create_tagged_event(tag="acl_66")
    second = torchair.ops.npu_create_tagged_event(tag="acl_77")
    model = _tagged_event_model(first, second)
    compiled, backend = _compile(model, UPSTREAM_USUAL, fullgraph=True, dynamic=False)
    _same_as_eager(compiled, model, *_randn(3, 3))
    graph = _last(backend)
    assert len(_nodes(graph, air.tagged_event_record.default)) == 2
    assert not _nodes(graph, air.tagged_event_wait.default)
    control = [s for s in graph.plan.syncs if s.reason == "control"]
    assert sorted((s.producer_stream, s.consumer_stream) for s in control) == [
        (None, "1"),
        (None, "2"),
    ]
    for label in ("1", "2"):
        steps = graph.plan.stream(label).steps
        first_run = next(i for i, step in enumerate(steps) if type(step).__name__ == "Run")
        assert steps[first_run].node.target is aten.mm.default
        assert any(type(step).__name__ == "Wait" for step in steps[:first_run])


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_multi_stream_with_multi_graph")
def test_npu_multi_stream_with_multi_graph() -> None:
    # upstream: a branch makes two graphs; the global tag->event/stream registries do not grow when
    # the first graph runs again; port: two compiles (streams {1,2} and {1}), the third call
    # reuses the first graph, all calls match eager
    first = torchair.ops.npu_create_tagged_event(tag="acl_666666")
    second = torchair.ops.npu_create_tagged_event(tag="acl_777777")

    class Model(torch.nn.Module):
        def forward(self, in1: Any, in2: Any, in3: Any, in4: Any, is_pr: bool) -> Any:
            add_result = torch.add(in1, in2)
            torchair.ops.npu_tagged_event_record(first)
            torchair.ops.npu_tagged_event_record(second)
            mm_result2 = add_result
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.ops.npu_tagged_event_wait(first)
                mm_result1 = torch.mm(in3, in4)
                if is_pr:
                    with torchair.scope.npu_stream_switch("2", 3):
                        torchair.ops.npu_tagged_event_wait(second)
                        mm_result2 = torch.mm(in3, in4)
            return add_result, mm_result1, mm_result2

    model = Model()
    compiled, backend = _compile(model, UPSTREAM_USUAL, fullgraph=True, dynamic=False)
    inputs = _randn(3, 3)
    _same_as_eager(compiled, model, *inputs, True)
    _same_as_eager(compiled, model, *inputs, False)
    _same_as_eager(compiled, model, *inputs, True)
    graphs = _compiled_graphs(backend)
    assert [g.streams.side_streams for g in graphs] == [("1", "2"), ("1",)]


@upstream("tests/st/torchair_aclgraph_st.py::test_eager_with_multi_stream_event")
def test_eager_with_multi_stream_event() -> None:
    # upstream: eager code records a tagged event on one npu stream and waits on another, twice;
    # port: the same eager code gives the plain results both times, and the tag stays taken
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stream1 = torch.npu.Stream()
            self.stream2 = torch.npu.Stream()
            self.ext_event = torchair.ops.npu_create_tagged_event(tag="acl_33")

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.npu.stream(self.stream1):
                y = x + 1
                y = y * y
                y = y @ y
                torchair.ops.npu_tagged_event_record(self.ext_event)
            with torch.npu.stream(self.stream2):
                torchair.ops.npu_tagged_event_wait(self.ext_event)
                z = x - 1
                z = z @ z
            return y, z

    model = Model()
    x = torch.randn(3, 3)
    want = (((x + 1) * (x + 1)) @ ((x + 1) * (x + 1)), (x - 1) @ (x - 1))
    for _ in range(2):
        _close(model(x), want)
    with pytest.raises(ValueError, match="tagged event tag acl_33 is already in use"):
        Model()


class _SuperKernelAroundSwitch(torch.nn.Module):
    def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> tuple[torch.Tensor, ...]:
        add_result = torch.add(in1, in2)
        with torchair.scope.super_kernel("1", "2"):
            mm_result1 = torch.add(in3, in4)
            with torchair.scope.npu_stream_switch("2", 3):
                mm_result2 = torch.mm(in3, in4)
        with torchair.scope.limit_core_num(1, 2):
            mm_result3 = torch.add(in3, in4)
        return add_result, mm_result1, mm_result2, mm_result3


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_stream_switch_with_super_kernel_scope")
def test_npu_stream_switch_with_super_kernel_scope() -> None:
    # upstream: only the stream switch gets an event wait (2 tagged records); super_kernel and
    # limit_core_num add none; port: only mm leaves main (stream 2), every sync involves stream 2,
    # and the super_kernel / core-limit attrs reach their nodes
    compiled, backend = _compile(
        _SuperKernelAroundSwitch(), UPSTREAM_USUAL, fullgraph=True, dynamic=False
    )
    _same_as_eager(compiled, _SuperKernelAroundSwitch(), *_randn(3, 3))
    graph = _last(backend)
    (mm,) = _nodes(graph, aten.mm.default)
    add, add_1, add_2 = _nodes(graph, aten.add.Tensor)
    assert graph.streams.side_streams == ("2",)
    assert _stream(graph, mm) == "2"
    assert {_stream(graph, n) for n in (add, add_1, add_2)} == {None}
    assert graph.plan.syncs and all(
        "2" in (s.producer_stream, s.consumer_stream) for s in graph.plan.syncs
    )
    attrs = graph.streams.scope_attrs
    assert attrs[add_1.name]["_super_kernel_scope"] == "1"
    assert attrs[mm.name]["_super_kernel_scope"] == "1"
    assert attrs[add_2.name]["_op_aicore_num"] == "1"
    assert add.name not in attrs


class _NestedScopesInSwitch(torch.nn.Module):
    def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> tuple[torch.Tensor, ...]:
        add_result = torch.add(in1, in2)
        with torchair.scope.super_kernel("1", "2"):
            mm_result1 = torch.add(in3, in4)
            with torchair.scope.npu_stream_switch("2", 3):
                mm_result2 = torch.mm(in3, in4)
                with torchair.scope.limit_core_num(1, 2):
                    mm_result3 = torch.add(in3, in4)
                    with torchair.scope.super_kernel("1", "2"):
                        mm_result4 = torch.add(in3, in4)
        return add_result, mm_result1, mm_result2, mm_result3, mm_result4


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_npu_stream_switch_with_super_kernel_scope_with_nest_scope"
)
def test_npu_stream_switch_with_super_kernel_scope_with_nest_scope() -> None:
    # upstream: scopes nested inside the stream switch add no event waits (2 tagged records);
    # port: the ops under the nested scopes stay on stream 2 with the switch's mm, the only side
    # stream is 2, and the inner attrs apply
    compiled, backend = _compile(
        _NestedScopesInSwitch(), UPSTREAM_USUAL, fullgraph=True, dynamic=False
    )
    _same_as_eager(compiled, _NestedScopesInSwitch(), *_randn(3, 3))
    graph = _last(backend)
    (mm,) = _nodes(graph, aten.mm.default)
    add, add_1, add_2, add_3 = _nodes(graph, aten.add.Tensor)
    assert graph.streams.side_streams == ("2",)
    assert [_stream(graph, n) for n in (add, add_1, mm, add_2, add_3)] == [
        None,
        None,
        "2",
        "2",
        "2",
    ]
    attrs = graph.streams.scope_attrs
    assert attrs[add_2.name]["_op_aicore_num"] == "1"
    assert attrs[add_3.name]["_super_kernel_scope"] == "1"


@upstream("tests/st/torchair_aclgraph_st.py::test_limit_core_num_in_aclgraph")
def test_limit_core_num_in_aclgraph() -> None:
    # upstream: limit_core_num scopes lower to paired get/set_stream_limit calls on the current
    # stream (scope enter/exit balanced) for 3 models; port: the same 3 models match eager, core
    # limits (innermost wins) reach each mm, only a stream switch makes a side stream
    def model_1(in1: Any, in2: Any, in3: Any, in4: Any) -> Any:
        add_result = torch.add(in1, in2)
        with torchair.scope.limit_core_num(2, 4):
            mm_result1 = torch.mm(in3, in4)
            with torchair.scope.limit_core_num(12, 24):
                mm_result2 = torch.mm(in3, in4)
        return add_result, mm_result1, mm_result2

    def model_2(in1: Any, in2: Any, in3: Any, in4: Any) -> Any:
        add_result = torch.add(in1, in2)
        with torchair.scope.limit_core_num(2, 4):
            mm_result1 = torch.mm(in3, in4)
            with torchair.scope.npu_stream_switch("1", 3):
                mm_result2 = torch.mm(in3, in4)
        return add_result, mm_result1, mm_result2

    def model_3(in1: Any, in2: Any, in3: Any, in4: Any) -> Any:
        add_result = torch.add(in1, in2)
        with torchair.scope.limit_core_num(2, 4):
            mm_result1 = torch.mm(in3, in4)
            with torchair.scope.super_kernel("1", "2"):
                mm_result2 = torch.mm(in3, in4)
        return add_result, mm_result1, mm_result2

    inputs = _randn(3, 3)
    expected = {  # per model: (stream of each mm, aicore limit of each mm)
        model_1: ([None, None], ["2", "12"]),
        model_2: ([None, "1"], ["2", "2"]),
        model_3: ([None, None], ["2", "2"]),
    }
    for model, (streams, cores) in expected.items():
        compiled, backend = _compile(model, UPSTREAM_USUAL, fullgraph=True, dynamic=False)
        _same_as_eager(compiled, model, *inputs)
        graph = _last(backend)
        mms = _nodes(graph, aten.mm.default)
        assert [_stream(graph, n) for n in mms] == streams, model.__name__
        assert [graph.streams.scope_attrs[n.name]["_op_aicore_num"] for n in mms] == cores
        assert len(_nodes(graph, air.scope_enter.default)) == len(
            _nodes(graph, air.scope_exit.default)
        )


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_npu_stream_switch_no_support_npu_wait_tensor_with_reduce_over_head"
)
def test_npu_stream_switch_no_support_npu_wait_tensor_with_reduce_over_head() -> None:
    # upstream: npu_wait_tensor in reduce-overhead either runs or fails with "wait_tensor
    # kernel_impl is not implemented"; port: it runs, and each wait_tensor is a control edge from
    # the add on main into stream 1 / stream 2, ahead of that stream's mm
    class Model(torch.nn.Module):
        def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> Any:
            add_result = torch.add(in1, in2)
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.scope.npu_wait_tensor(in4, add_result)
                mm_result1 = torch.mm(in3, in4)
                with torchair.scope.npu_stream_switch("2", 3):
                    torchair.scope.npu_wait_tensor(in3, add_result)
                    mm_result2 = torch.mm(in3, in4)
            return add_result, mm_result1, mm_result2

    compiled, backend = _compile(Model(), UPSTREAM_USUAL, dynamic=False)
    _same_as_eager(compiled, Model(), *_randn(2, 2))
    graph = _last(backend)
    (add,) = _nodes(graph, aten.add.Tensor)
    control = {(s.producer, s.consumer_stream) for s in graph.plan.syncs if s.reason == "control"}
    assert control == {(add, "1"), (add, "2")}
    assert [_stream(graph, n) for n in _nodes(graph, aten.mm.default)] == ["1", "2"]


@upstream("tests/st/torchair_aclgraph_st.py::test_record_stream_with_reduce_over_head")
def test_record_stream_with_reduce_over_head() -> None:
    # upstream: npu_record_tagged_stream shows up as air.record_tagged_stream in the FX graph (log);
    # port: a custom pre pass sees that node in the aten graph, the consumer of A runs on the tagged
    # stream after a data edge from main, and B / C match eager
    seen: list[Any] = []

    def look(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")

    def func() -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.ones([100, 100])
        mm_input = torch.randn(32, 32)
        with torchair.scope.npu_stream_switch("second_stream", 3):
            for _ in range(3):
                _ = mm_input * mm_input
            b = a.add(1)
            torchair.ops.npu_record_tagged_stream(a, "second_stream")
        del a
        c = torch.ones([100, 100])
        c.add_(2)
        return b, c

    compiled, backend = _compile(
        func,
        {
            "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": True,
            "post_grad_custom_pre_pass": look,
        },
        dynamic=False,
    )
    with torch.no_grad():
        b, c = compiled()
    torch.testing.assert_close(b, torch.full((100, 100), 2.0))
    torch.testing.assert_close(c, torch.full((100, 100), 3.0))
    assert air.record_tagged_stream.default in seen
    graph = _last(backend)
    (add_b,) = (n for n in _nodes(graph, aten.add.Tensor) if n.args[1] == 1)
    assert _stream(graph, add_b) == "second_stream"
    assert any(
        s.consumer is add_b and s.producer_stream is None and s.reason == "data"
        for s in graph.plan.syncs
    )


def _control_edges(graph: CompiledGraph) -> set[tuple[str, str | None, str | None]]:
    """``(producer target name, producer stream, consumer stream)`` of each control sync."""
    return {
        (str(s.producer.target), s.producer_stream, s.consumer_stream)
        for s in graph.plan.syncs
        if s.reason == "control"
    }


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_stream_record_wait_with_wait")
def test_npu_stream_record_wait_with_wait() -> None:
    # upstream: wait([tensor]) gets an air.record inserted after the producer ("End insert record
    # node"), plus closure tagged events; port: control edges mm(main)->1, mm(main)->2 and
    # abs(1)->2, the main stream waits for the result, output = eager
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mm = torch.mm(x, x)
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.ops.wait([mm])
                abs1 = torch.abs(mm)
                add1 = torch.add(abs1, 1)
            with torchair.scope.npu_stream_switch("2", 3):
                torchair.ops.wait([mm, abs1])
                sub = torch.sub(add1, mm)
            return sub

    compiled, backend = _compile(Model(), UPSTREAM_USUAL, dynamic=False)
    _same_as_eager(compiled, Model(), torch.randn(3, 3))
    graph = _last(backend)
    assert _control_edges(graph) == {
        ("aten.mm.default", None, "1"),
        ("aten.mm.default", None, "2"),
        ("aten.abs.default", "1", "2"),
    }
    assert [_stream(graph, n) for n in _nodes(graph, aten.sub.Tensor)] == ["2"]
    assert any(s.consumer.op == "output" and s.producer_stream == "2" for s in graph.plan.syncs)


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_stream_record_wait_with_record")
def test_npu_stream_record_wait_with_record() -> None:
    # upstream: record()/wait([token]) appear as air.record/air.wait nodes, plus closure events;
    # port: each token orders the next stream after the last op before its record: mm(main)->1,
    # abs(1)->2, abs(1)->3, add(2)->3
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mm = torch.mm(x, x)
            result1 = torchair.ops.record()
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.ops.wait([result1])
                abs1 = torch.abs(mm)
                result2 = torchair.ops.record()
            with torchair.scope.npu_stream_switch("2", 3):
                torchair.ops.wait([result2])
                add1 = torch.add(abs1, 1)
                result3 = torchair.ops.record()
            with torchair.scope.npu_stream_switch("3", 3):
                torchair.ops.wait([result2, result3])
                sub = torch.sub(abs1, add1)
            return sub

    compiled, backend = _compile(Model(), UPSTREAM_USUAL, dynamic=False)
    _same_as_eager(compiled, Model(), torch.randn(3, 3))
    graph = _last(backend)
    assert len(_nodes(graph, air.record.default)) == 3
    assert _control_edges(graph) == {
        ("aten.mm.default", None, "1"),
        ("aten.abs.default", "1", "2"),
        ("aten.abs.default", "1", "3"),
        ("aten.add.Tensor", "2", "3"),
    }


@upstream("tests/st/torchair_aclgraph_st.py::test_npu_stream_record_wait_with_record_wait")
def test_npu_stream_record_wait_with_record_wait() -> None:
    # upstream: a mix of record tokens and waited tensors gives air.record/air.wait nodes plus
    # closure events; port: control edges mm(main)->1, abs(1)->2, abs(1)->3, add(2)->3
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mm = torch.mm(x, x)
            result1 = torchair.ops.record()
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.ops.wait([result1])
                abs1 = torch.abs(mm)
            with torchair.scope.npu_stream_switch("2", 3):
                torchair.ops.wait([abs1])
                add1 = torch.add(abs1, 1)
                result3 = torchair.ops.record()
            with torchair.scope.npu_stream_switch("3", 3):
                torchair.ops.wait([abs1, result3])
                sub = torch.sub(abs1, add1)
            return sub

    compiled, backend = _compile(Model(), UPSTREAM_USUAL, dynamic=False)
    _same_as_eager(compiled, Model(), torch.randn(3, 3))
    graph = _last(backend)
    assert _control_edges(graph) == {
        ("aten.mm.default", None, "1"),
        ("aten.abs.default", "1", "2"),
        ("aten.abs.default", "1", "3"),
        ("aten.add.Tensor", "2", "3"),
    }


# ---------------------------------------------------------------------------------------------
# input mutations and in-place rewriting


@upstream("tests/st/torchair_aclgraph_st.py::test_reinplace_pass_disblabled_with_multi_stream")
def test_reinplace_pass_disblabled_with_multi_stream() -> None:
    # upstream: with a stream switch the clone's add stays out-of-place (no add_) while the input
    # write is done in place (mul_); port: outputs and y match eager, y's write-back is folded
    # into an in-place mul_ that still runs on stream 1, and no add_ (the clone is removed as a
    # no-op, so add reads the input x, which must not be written)
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            b = x.clone().add(1)
            with torchair.scope.npu_stream_switch("1", 3):
                y.mul_(2)
            return b, y

    compiled, backend = _compile(
        Model(),
        {**CLONE_OFF, "experimental_config.keep_inference_input_mutations": True},
        dynamic=False,
    )
    with torch.no_grad():
        _same_as_eager(compiled, Model(), *_randn(8, 8, n=2))
    graph = _last(backend)
    assert [_stream(graph, n) for n in _nodes(graph, aten.mul_.Tensor)] == ["1"]
    assert aten.mul.Tensor not in _targets(graph) and not _copies_back(graph)
    assert aten.add_.Tensor not in _targets(graph)


class _CloneAddAndMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        b = x.clone().add(1)
        y.mul_(2)
        return b, y


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_true_default_enable_reinplace_pass"
)
def test_aclgraph_keep_inference_input_mutations_true_default_enable_reinplace_pass() -> None:
    # upstream: by default the clone's add becomes add_ and the input write mul_; port: outputs
    # and y match eager, then add_ and mul_ in the optimized graph
    compiled, backend = _compile(
        _CloneAddAndMul(),
        {
            **CLONE_OFF,
            "experimental_config.keep_inference_input_mutations": True,
            "experimental_config.remove_noop_ops": False,
        },
        dynamic=False,
    )
    with torch.no_grad():
        _same_as_eager(compiled, _CloneAddAndMul(), *_randn(8, 8, n=2))
    targets = _targets(_last(backend))
    assert aten.add_.Tensor in targets
    assert aten.mul_.Tensor in targets


def _slice_mutation_check(options: dict[str, Any], scale: float, shift: float) -> None:
    def mutate_head(x: torch.Tensor) -> torch.Tensor:
        x = x[:2]
        x.add_(shift)
        x.mul_(scale)
        return x

    compiled, backend = _compile(
        mutate_head,
        {**CLONE_OFF, "experimental_config.keep_inference_input_mutations": True, **options},
        dynamic=False,
    )
    x = torch.randn(8, 8)
    before = x.clone()
    with torch.no_grad():
        out = _same_as_eager(compiled, mutate_head, x)
    torch.testing.assert_close(x[2:], before[2:])  # only the first two rows are written
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view of x
    assert _writes_input(_last(backend))


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_true_disable_reinplace_pass_with_slice"
)
def test_aclgraph_keep_inference_input_mutations_true_disable_reinplace_pass_with_slice() -> None:
    # upstream: the input-mutation reinplace pass runs (log "processing
    # reinplace_input_mutated_ops_pass"); port: in-place writes through a slice reach only those
    # rows of the input, the output is a view of the input, the write-back is in the graph
    _slice_mutation_check({"debug.aclgraph.disable_reinplace_inplaceable_ops_pass": True}, 7, 5)


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_keep_inference_input_mutations_true_disable_mutated_input_pass_with_slice"
)
def test_aclgraph_keep_inference_input_mutations_true_disable_mutated_input_pass_with_slice() -> (
    None
):
    # upstream: the inplaceable-ops reinplace pass runs ("processing reinplace_inplaceable_ops_pass"
    # log); port: as the slice test above with the other pass disabled
    _slice_mutation_check({"debug.aclgraph.disable_reinplace_input_mutated_ops_pass": True}, 3, 1)


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_true_disable_reinplace_mutated_input"
)
def test_aclgraph_keep_inference_input_mutations_true_disable_reinplace_mutated_input() -> None:
    # upstream: the clone's add becomes add_ and, with no input written, no copy_; port: outputs
    # and unchanged inputs match eager, no copy_ into an input, then add_ in the graph
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            b = x.clone().add(1)
            y.mul(3)
            return b, y

    compiled, backend = _compile(
        Model(),
        {
            **CLONE_OFF,
            "experimental_config.keep_inference_input_mutations": True,
            "debug.aclgraph.disable_reinplace_input_mutated_ops_pass": True,
            "experimental_config.remove_noop_ops": False,
        },
        dynamic=False,
    )
    with torch.no_grad():
        _same_as_eager(compiled, Model(), *_randn(8, 8, n=2))
    graph = _last(backend)
    assert aten.copy_.default not in _targets(graph)
    assert aten.add_.Tensor in _targets(graph)


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_true_disable_reinplace_inplaceable_ops"
)
def test_aclgraph_keep_inference_input_mutations_true_disable_reinplace_inplaceable_ops() -> None:
    # upstream: the graph holds mul (out of place), copy_ (into x) and add_ (the last write made
    # in place); port: x and the output match eager, mul and copy_ into x, then add_
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(2)
            x.add_(1)
            return x

    compiled, backend = _compile(
        Model(),
        {**UPSTREAM_USUAL, "experimental_config.keep_inference_input_mutations": True},
        dynamic=False,
    )
    with torch.no_grad():
        _same_as_eager(compiled, Model(), torch.randn(5, 8))
    graph = _last(backend)
    assert aten.mul.Tensor in _targets(graph)
    assert _writes_input(graph)
    assert aten.add_.Tensor in _targets(graph)


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_false_enable_reinplace_ops"
)
def test_aclgraph_keep_inference_input_mutations_false_enable_reinplace_ops() -> None:
    # upstream: with the inplaceable pass on, the add_ on a clone stays in place (add_); port:
    # outputs match eager and x/y are untouched, then add_ in the graph
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            b = x.clone().add_(1)
            y.mul(5)
            return b, x

    compiled, backend = _compile(
        Model(),
        {
            **CLONE_OFF,
            "experimental_config.keep_inference_input_mutations": False,
            "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": False,
            "experimental_config.remove_noop_ops": False,
        },
        dynamic=False,
    )
    with torch.no_grad():
        _same_as_eager(compiled, Model(), *_randn(8, 8, n=2))
    assert aten.add_.Tensor in _targets(_last(backend))


@upstream(
    "tests/st/torchair_aclgraph_st.py::"
    "test_aclgraph_capture_and_replay_keep_inference_input_mutations_false_disable_reinplace_ops"
)
def test_aclgraph_keep_inference_input_mutations_false_disable_reinplace_ops() -> None:
    # upstream: with input mutations kept out of the graph and reinplace off, no add_ in the graph;
    # port: no add_ and no copy_ into an input, and x is still written as eager writes it
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            x.clone()
            b = x.add_(1)
            y.mul(6)
            return b, x

    compiled, backend = _compile(
        Model(),
        {**UPSTREAM_USUAL, "experimental_config.keep_inference_input_mutations": False},
        dynamic=False,
    )
    with torch.no_grad():
        _same_as_eager(compiled, Model(), *_randn(8, 8, n=2))
    graph = _last(backend)
    assert aten.add_.Tensor not in _targets(graph)
    assert not _writes_input(graph)


_sin_cos_lib = torch.library.Library("acl_port", "FRAGMENT")
_sin_cos_lib.define("sin_cos_inplace(Tensor x, Tensor(a!) out_sin, Tensor(b!) out_cos) -> Tensor")


@torch.library.impl(_sin_cos_lib, "sin_cos_inplace", "CompositeExplicitAutograd")
def _sin_cos_inplace(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> torch.Tensor:
    out_sin.sin_()
    out_cos.cos_()
    return x + 1


@torch.library.impl(_sin_cos_lib, "sin_cos_inplace", "Meta")
def _sin_cos_inplace_meta(x: torch.Tensor, out_sin: Any, out_cos: Any) -> torch.Tensor:
    return torch.empty_like(x)


sin_cos_inplace = torch.ops.acl_port.sin_cos_inplace.default


@upstream("tests/st/torchair_aclgraph_st.py::test_multi_mutated_input")
def test_multi_mutated_input() -> None:
    # upstream: a custom op writing two of its inputs is called directly (in place) in the final
    # graph; port: result and both written inputs match eager, then the direct call in the graph
    def f(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> torch.Tensor:
        return sin_cos_inplace(x, out_sin, out_cos)

    compiled, backend = _compile(f, CLONE_OFF)
    _same_as_eager(compiled, f, *_randn(3, n=3))
    assert sin_cos_inplace in _targets(_last(backend))


@upstream("tests/st/torchair_aclgraph_st.py::test_multi_mutated_input_with_view_before")
def test_multi_mutated_input_with_view_before() -> None:
    # upstream: writing through a view made before the call cannot be reinplaced ("reinplace
    # failed" log); port (differs): airstream calls the op directly on that view of the input
    # (an as_strided view made before the call), and the base, the other input and both results
    # match eager
    def f(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> Any:
        sin_view = out_sin.view(-1, 1)
        y = sin_cos_inplace(x, sin_view, out_cos)
        return y, out_cos + 1

    compiled, backend = _compile(f, CLONE_OFF)
    _same_as_eager(compiled, f, torch.ones(3), torch.ones(3), torch.ones(3))
    gm = _last(backend).graph_module
    (call,) = [n for n in gm.graph.nodes if n.target is sin_cos_inplace]
    view = call.kwargs["out_sin"]
    assert view.target is torch.ops.aten.as_strided.default and view.args[0].op == "placeholder"
    assert torch.ops.higher_order.auto_functionalized_v2 not in _targets(_last(backend))


@upstream("tests/st/torchair_aclgraph_st.py::test_multi_mutated_input_with_view_after")
def test_multi_mutated_input_with_view_after() -> None:
    # upstream: a view taken after the call does not block reinplacing: the op is called
    # directly; port: results and written inputs match eager, then the direct call in the graph
    def f(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> Any:
        y = sin_cos_inplace(x, out_sin, out_cos)
        return y, out_sin.view(-1, 1) + 1

    compiled, backend = _compile(f, CLONE_OFF)
    _same_as_eager(compiled, f, torch.ones(3), torch.ones(3), torch.ones(3))
    assert sin_cos_inplace in _targets(_last(backend))


# ---------------------------------------------------------------------------------------------
# no-op removal


@upstream("tests/st/torchair_aclgraph_st.py::test_enable_remove_noop_ops_slice_acl")
def test_enable_remove_noop_ops_slice_acl() -> None:
    # upstream: full-range slices are gone from the final graph (patched AclConcreteGraph); port:
    # no aten.slice in the optimized graph with remove_noop_ops on (and they are there with it off)
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x[:] + y[:]

    for remove, has_slice in ((True, False), (False, True)):
        compiled, backend = _compile(
            Model(),
            {
                "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": True,
                "experimental_config.remove_noop_ops": remove,
            },
            dynamic=True,
        )
        x, y = torch.randn(2, 2), torch.randn(2, 2)
        _close(compiled(x=x, y=y), x + y)
        assert (aten.slice.Tensor in _targets(_last(backend))) is has_slice
        torch.compiler.reset()


class _ZerosCopy(torch.nn.Module):
    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zeros = torch.zeros_like(x)
        return zeros.copy_(x) + self.shift


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_enable_remove_noop_ops_and_eliminate_dead_code_acl"
)
def test_enable_remove_noop_ops_and_eliminate_dead_code_acl() -> None:
    # upstream: zeros_like(x).copy_(x) collapses to x and the zeros_like is gone; port: output
    # matches eager, then no zeros_like in the optimized graph
    compiled, backend = _compile(_ZerosCopy(1), CLONE_OFF, dynamic=True)
    _same_as_eager(compiled, _ZerosCopy(1), torch.randn(2, 2))
    assert aten.zeros_like.default not in _targets(_last(backend))


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_disable_remove_noop_ops_and_eliminate_dead_code_acl"
)
def test_disable_remove_noop_ops_and_eliminate_dead_code_acl() -> None:
    # upstream: with remove_noop_ops off the zeros_like stays; port: the same, output = eager
    compiled, backend = _compile(
        _ZerosCopy(2), {**CLONE_OFF, "experimental_config.remove_noop_ops": False}, dynamic=True
    )
    _same_as_eager(compiled, _ZerosCopy(2), torch.randn(2, 2))
    assert aten.zeros_like.default in _targets(_last(backend))


# ---------------------------------------------------------------------------------------------
# custom passes, options, npugraph_ex mode


@upstream("tests/st/torchair_aclgraph_st.py::test_debug_compare_fx_graphs")
def test_debug_compare_fx_graphs(debug_logger: logging.Logger) -> None:
    # upstream: DEBUG logs one "After fx graph pass(<name>)" summary per TorchAir pass (custom ones
    # included) and none at INFO; port: the custom passes' scope markers put sqrt/mm/add on
    # stream0 and softmax..split on stream1, DEBUG logs both custom passes, INFO logs none
    class Network(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.relu = torch.nn.ReLU()

        def forward(self, x: Any, y: Any, z: Any) -> torch.Tensor:
            soft = torch.softmax(torch.sqrt(x), dim=-1)
            top, bottom = torch.split(torch.abs(soft), split_size_or_sections=[6, 6], dim=0)
            joined = torch.cat([torch.add(bottom, torch.matmul(top, y)), z], dim=0)
            return torch.transpose(self.relu(joined), 0, 1)

    def wrap(gm: torch.fx.GraphModule, first: Any, last: Any, label: str) -> None:
        graph = gm.graph
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target == first:
                with graph.inserting_before(node):
                    graph.call_function(air.scope_enter.default, (["_user_stream_label"], [label]))
            if node.op == "call_function" and node.target == last:
                with graph.inserting_after(node):
                    graph.call_function(air.scope_exit.default, ())

    def pre(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        wrap(gm, aten.sqrt.default, aten.add.Tensor, "stream0")

    def post(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        wrap(gm, aten._softmax.default, aten.split_with_sizes.default, "stream1")

    options = {
        **CLONE_OFF,
        "post_grad_custom_pre_pass": pre,
        "post_grad_custom_post_pass": post,
    }
    compiled, backend = _compile(Network(), options, fullgraph=True, dynamic=False)
    inputs = (torch.rand(12, 6), torch.randn(6, 6), torch.randn(12, 6))
    with capture_logger() as log:
        _same_as_eager(compiled, Network(), *inputs)
    text = log.getvalue()
    for slot in ("post_grad_custom_pre_pass", "post_grad_custom_post_pass"):
        assert f"before [{slot}] execution" in text
        assert f"after [{slot}] execution" in text
    graph = _last(backend)
    where = {
        str(n.target): _stream(graph, n)
        for n in graph.graph_module.graph.nodes
        if n.op == "call_function" and str(n.target).startswith("aten.")
    }
    assert where == {
        "aten.sqrt.default": "stream0",
        "aten._softmax.default": "stream1",
        "aten.abs_.default": "stream1",  # in place on softmax's result (reinplace pass)
        "aten.split_with_sizes.default": "stream1",
        "aten.mm.default": "stream0",
        "aten.add.Tensor": "stream0",
        "aten.cat.default": None,
        "aten.relu_.default": None,  # in place on cat's result
        "aten.transpose.int": None,
    }

    torch.compiler.reset()
    debug_logger.setLevel(logging.INFO)
    with capture_logger() as log:
        _same_as_eager(compiled, Network(), *inputs)
    assert "execution, graph is" not in log.getvalue()


@upstream(
    "tests/st/torchair_aclgraph_st.py::test_npugraph_ex_process_kwargs_options_invalid_option"
)
def test_npugraph_ex_process_kwargs_options_invalid_option() -> None:
    # upstream: npugraph_ex options inplace_pass / input_inplace_pass / reuse_graph_pool_in_same_fx
    # set to 'test' fail in the bool option's words; port: the config options they map to reject
    # 'test' with that message (the setter TorchAir's option processing calls)
    config = CompilerConfig()
    for name in (
        "disable_reinplace_inplaceable_ops_pass",
        "disable_reinplace_input_mutated_ops_pass",
        "disable_mempool_reuse_in_same_fx",
    ):
        with pytest.raises(ValueError) as info:
            setattr(config.debug.aclgraph, name, "test")
        assert (
            "(type: <class 'str'>) not in optional list [True, False] (type: <class 'bool'>)"
            in (str(info.value))
        )


@upstream("tests/st/torchair_aclgraph_st.py::test_aclgraph_core_limit_with_static_kernel")
def test_aclgraph_core_limit_with_static_kernel() -> None:
    # upstream: static-shape kernels with a core-limit scope raise no "When both static shape
    # kernel and core limit are enabled" warning and keep the option on; port: the same, and the
    # square matches eager
    def model(x: torch.Tensor) -> torch.Tensor:
        with torchair.scope.limit_core_num(12, 24):
            return torch.square(x)

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    with capture_warnings() as caught:
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        backend = torchair.get_npu_backend(compiler_config=config)
        compiled = torch.compile(model, backend=backend, dynamic=False)
        _same_as_eager(compiled, model, torch.randn(5, 5))
    assert "When both static shape kernel and core limit are enabled" not in caught.getvalue()
    assert config.experimental_config.aclgraph._aclnn_static_shape_kernel.value == "1"


FORCE_EAGER_IGNORED = (
    "surface gap: torch.compile(..., options={'force_eager': True}) is ignored by the backend; "
    "TorchAir maps npugraph_ex options onto the config (force_eager -> debug.run_eagerly)"
)


@upstream("tests/st/torchair_aclgraph_st.py::test_force_eager_with_multi_stream")
def test_force_eager_with_multi_stream() -> None:
    # upstream: npugraph_ex with force_eager runs the eager code, each stream block under
    # torch.npu.stream of its tag (printed code); port: outputs match eager, mm/mm_1 on streams
    # 2/3 with control edges from the add, then the graph runs eagerly (run_eagerly's executor)
    class Model(torch.nn.Module):
        def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> Any:
            add_result = torch.add(in1, in2)
            with torchair.scope.npu_stream_switch("2", 3):
                torchair.scope.npu_wait_tensor(in4, add_result)
                mm_result1 = torch.mm(in3, in4)
                with torchair.scope.npu_stream_switch("3", 3):
                    torchair.scope.npu_wait_tensor(in3, add_result)
                    mm_result2 = torch.mm(in3, in4)
            return add_result, mm_result1, mm_result2

    backend = torchair.get_npu_backend(compiler_config=_config(mode="npugraph_ex"))
    compiled = torch.compile(
        Model(), backend=backend, dynamic=False, fullgraph=True, options={"force_eager": True}
    )
    _same_as_eager(compiled, Model(), *_randn(64, 64, dtype=torch.float16))
    graph = _last(backend)
    assert [_stream(graph, n) for n in _nodes(graph, aten.mm.default)] == ["2", "3"]
    assert {s.consumer_stream for s in graph.plan.syncs if s.reason == "control"} == {"2", "3"}
    assert isinstance(graph.executor, SerialExecutor)


@upstream("tests/st/torchair_aclgraph_st.py::test_force_eager_with_multi_stream_and_static_kernel")
def test_force_eager_with_multi_stream_and_static_kernel() -> None:
    # upstream: force_eager with static kernels, tagged events and record_tagged_stream prints
    # eager code with stream blocks '1' and '2'; port: outputs match eager, stream 1 waits for
    # main and stream 2 for stream 1 (the two tagged events), then the graph runs eagerly
    first = torchair.ops.npu_create_tagged_event(tag="acl_event1")
    second = torchair.ops.npu_create_tagged_event(tag="acl_event2")

    class Model(torch.nn.Module):
        def forward(self, in1: Any, in2: Any, in3: Any, in4: Any) -> Any:
            add_result = torch.add(in1, in2)
            torchair.ops.npu_tagged_event_record(first)
            with torchair.scope.npu_stream_switch("1"):
                torchair.ops.npu_tagged_event_wait(first)
                mm_result = torch.mm(in3, in4)
                torchair.ops.npu_tagged_event_record(second)
                b = in3 + in4
                torchair.ops.npu_record_tagged_stream(b, "1")
            mm1 = torch.mm(in3, in4)
            del b
            c = torch.ones(64, 64, dtype=torch.float16)
            c.add_(2)
            with torchair.scope.npu_stream_switch("2"):
                torchair.ops.npu_tagged_event_wait(second)
                add2 = torch.add(in3, in4)
            return add_result, mm_result, mm1, add2, c

    config = _config(
        {"experimental_config.aclgraph._aclnn_static_shape_kernel": True}, mode="npugraph_ex"
    )
    backend = torchair.get_npu_backend(compiler_config=config)
    compiled = torch.compile(
        Model(), backend=backend, dynamic=False, fullgraph=True, options={"force_eager": True}
    )
    _same_as_eager(compiled, Model(), *_randn(64, 64, dtype=torch.float16))
    graph = _last(backend)
    control = {
        (s.producer_stream, s.consumer_stream) for s in graph.plan.syncs if s.reason == "control"
    }
    assert control == {(None, "1"), ("1", "2")}
    assert isinstance(graph.executor, SerialExecutor)
