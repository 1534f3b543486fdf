"""airstream's Inductor segments call their C++ kernels without the GIL, so that two streams'
kernels run at once (``torch_internals/kernel_gil.py``); ``AIRSTREAM_KERNEL_GIL=hold`` keeps
Inductor's binding. The gain itself is a benchmark (``airstream bench kernel-split``)."""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, cause_of, compile_model, graph_of, slow

import airstream
from airstream import passes, torch_internals
from airstream.debug.observers import CompiledGraph
from airstream.errors import ConfigError

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

# Each compile below gets constants of its own: a process loads one module per kernel code, so a
# kernel an earlier test loaded would be reused as it loaded, and the test would see nothing new.
_scales = itertools.count(1)

GIL_CHECK = """
extern "C" int PyGILState_Check(void);
extern "C" void kernel(float* out, const int64_t offset) { out[0] = PyGILState_Check() + offset; }
"""


def test_a_kernel_bound_inside_runs_without_the_gil() -> None:
    with torch_internals.kernels_without_gil() as released:
        free = torch_internals.bind_cpu_kernel(["float*", "const int64_t"], GIL_CHECK)
    assert released
    out = torch.zeros(1)
    free(out, 10)
    assert out.item() == 10  # no GIL; the arguments were still parsed (offset 10)


@slow(
    "a second C++ build of the kernel, with torch's binding",
    "tests/test_kernel_gil.py::test_a_kernel_bound_inside_runs_without_the_gil",
)
def test_a_kernel_bound_outside_runs_with_the_gil_as_torch_binds_it() -> None:
    out = torch.zeros(1)
    with torch_internals.kernels_without_gil():
        pass  # the binding outside is torch's again
    held = torch_internals.bind_cpu_kernel(["float*", "const int64_t"], GIL_CHECK)
    held(out, 10)
    assert out.item() == 11  # the kernel saw the GIL held: the check above can fail


def test_a_kernel_without_the_gil_still_reports_a_bad_argument() -> None:
    with torch_internals.kernels_without_gil():
        free = torch_internals.bind_cpu_kernel(["float*", "const int64_t"], GIL_CHECK)
    with pytest.raises(RuntimeError, match="expected int arg"):
        free(torch.zeros(1), "ten")
    out = torch.zeros(1)
    free(out, 3)  # the failed call left the GIL as it found it
    assert out.item() == 3


class Chain(torch.nn.Module):
    def __init__(self, k: float, shift: float) -> None:
        super().__init__()
        self.k, self.shift = k, shift

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            y = torch.tanh(y) * self.k + self.shift
        return y


class Chains(torch.nn.Module):
    """Two pointwise chains on one input, summed: one per stream."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList([Chain(0.5, shift), Chain(0.75, shift)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branches[0](x) + self.branches[1](x)


def second_chain_on_side(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    passes.place_on_stream(gm, passes.select_nodes(gm, module=r"branches\.1"), "side")


def _two_streams(shift: float) -> tuple[torch.Tensor, torch.Tensor, CompiledGraph]:
    """The chains compiled in the default mode with the second on stream ``side``: (result,
    eager's, the graph)."""
    model, x = Chains(shift), torch.randn(64, 32)
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = second_chain_on_side
    compiled, backend = compile_model(model, config)
    return compiled(x), model(x), graph_of(backend, "inference")


def _new_kernels(before: set[str]) -> dict[str, str]:
    return {
        name: path.read_text()
        for name, path in torch_internals.cpu_kernel_sources().items()
        if name not in before
    }


@pytest.mark.usefixtures("default_mode")
def test_every_kernel_of_a_two_stream_graph_lets_go_of_the_gil() -> None:
    before = set(torch_internals.cpu_kernel_sources())
    got, want, graph = _two_streams(1.0 + next(_scales) / 1024)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    assert {s.segment.stream for s in graph.segments if s.node is not None} >= {None, "side"}
    kernels = _new_kernels(before)
    assert kernels, "the compile loaded no C++ kernel"
    assert all(torch_internals.GIL_GUARD in source for source in kernels.values())


@pytest.mark.usefixtures("default_mode")
def test_airstream_kernel_gil_hold_keeps_inductors_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRSTREAM_KERNEL_GIL", "hold")
    before = set(torch_internals.cpu_kernel_sources())
    got, want, _ = _two_streams(2.0 + next(_scales) / 1024)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    kernels = _new_kernels(before)
    assert kernels, "the compile loaded no C++ kernel"
    assert not any(torch_internals.GIL_GUARD in source for source in kernels.values())


@pytest.mark.usefixtures("default_mode")
def test_a_bad_airstream_kernel_gil_names_the_variable_and_its_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRSTREAM_KERNEL_GIL", "off")
    with pytest.raises(Exception) as raised:  # Dynamo wraps the backend's error
        _two_streams(3.0)
    error = cause_of(raised.value, ConfigError)
    assert error is not None, raised.value
    assert re.search(
        r"'off' for environment variable AIRSTREAM_KERNEL_GIL.*'release', 'hold'", str(error)
    )


def test_where_the_binding_is_unknown_kernels_hold_the_gil_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airstream.torch_internals import kernel_gil, registry

    def changed() -> None:
        raise ValueError("call_entry_function is 'something else'")

    feature = registry.FEATURES["kernels_without_gil"]
    monkeypatch.setitem(
        registry.FEATURES, "kernels_without_gil", dataclasses.replace(feature, probe=changed)
    )
    monkeypatch.delitem(registry._resolved, "kernels_without_gil", raising=False)
    monkeypatch.setattr(registry, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with kernel_gil.kernels_without_gil() as released:
                assert not released
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "CppPythonBindingsCodeCache.call_entry_function" in messages[0]
    assert "segments on different streams take turns" in messages[0]
