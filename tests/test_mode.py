"""mode="default": the mode each graph compiles in is chosen by its device (airstream.graph.mode).

The test suite pins the default to reduce-overhead (tests/conftest.py sets AIRSTREAM_MODE): these
tests unset it to check the default itself, structure (the mode compiled in, Inductor segments)
next to numerics against eager, and the user errors around it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream import torch_internals
from airstream.errors import ConfigError
from airstream.graph import mode as modes

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x)) * 2 + 1).tanh()


@pytest.fixture
def per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default as a user gets it: $AIRSTREAM_MODE unset."""
    monkeypatch.delenv("AIRSTREAM_MODE", raising=False)
    modes._cpu_compiler_missing.cache_clear()
    yield
    modes._cpu_compiler_missing.cache_clear()


def test_the_default_on_cpu_compiles_inductor_segments_and_matches_eager(per_device) -> None:
    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 16)
    compiled, backend = compile_model(model)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert graph.mode == "max-autotune"
    assert graph.segments and all(s.node is not None for s in graph.segments)
    assert any(k.startswith("cpp_fused_") for s in graph.segments for k in s.kernels)
    assert "mode: max-autotune" in str(airstream.explain(model, x))


def test_an_explicit_mode_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRSTREAM_MODE", "max-autotune")
    config = airstream.CompilerConfig()
    assert modes.resolve_mode(config, "cpu") == "max-autotune"
    config.mode = "reduce-overhead"
    assert modes.resolve_mode(config, "cpu") == "reduce-overhead"
    monkeypatch.setenv("AIRSTREAM_MODE", "reduce-overhead")
    model, x = Block(), torch.randn(4, 16)
    compiled, backend = compile_model(model)
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert graph.mode == "reduce-overhead" and not graph.segments


def test_the_default_per_device_and_debug_option(per_device) -> None:
    config = airstream.CompilerConfig()
    assert modes.resolve_mode(config, "cpu") == "max-autotune"
    assert modes.resolve_mode(config, "cuda") == "reduce-overhead"  # one CUDA graph per call
    assert modes.resolve_mode(config, "mps") == "reduce-overhead"  # the CPU's default is its own
    config.debug.run_eagerly = True  # runs node by node: no kernels to compile
    assert modes.resolve_mode(config, "cpu") == "reduce-overhead"


def test_run_eagerly_compiles_nothing_whatever_airstream_mode_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRSTREAM_MODE", "max-autotune")
    config = airstream.CompilerConfig()
    config.debug.run_eagerly = True
    assert modes.resolve_mode(config, "cpu") == "reduce-overhead"


def test_no_cpp_compiler_falls_back_with_one_warning_saying_what_to_do(
    per_device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_internals, "inductor_cpp_compiler", lambda: "airstream-no-cxx")
    with pytest.warns(UserWarning, match=r"mode='default' on CPU.*'airstream-no-cxx' is not on"):
        assert modes.resolve_mode(airstream.CompilerConfig(), "cpu") == "reduce-overhead"
    with pytest.warns() as seen:  # decided once per process: no second warning
        assert modes.resolve_mode(airstream.CompilerConfig(), "cpu") == "reduce-overhead"
        warnings.warn("the only one", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["the only one"]


def test_a_bad_airstream_mode_names_the_variable_and_its_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRSTREAM_MODE", "fast")
    with pytest.raises(ConfigError, match=r"AIRSTREAM_MODE.*'reduce-overhead', 'max-autotune'"):
        modes.resolve_mode(airstream.CompilerConfig(), "cpu")
