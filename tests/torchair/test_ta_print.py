"""Ports of TorchAir's ``torchair_print_st.py`` and ``torchair_print_detail_st.py``: what
``torchair.ops.npu_print`` writes, eager and compiled, and how it rejects bad arguments.

Upstream compiles with ``backend="aot_eager"``; those tests also run here through airstream's
backend (``torchair.get_npu_backend()``), where ``air::print`` stays in the compiled graph. The
upstream tests that wrap the op's GE converter instead inspect the FX graph the backend hands
to ``post_grad_custom_pre_pass``.
"""

from __future__ import annotations

import pytest
import torch
from tests.torchair.conftest import capture_stdout, capture_warnings, upstream
from torchair.configs.compiler_config import CompilerConfig

import torchair

PRINT_ST = "tests/st/torchair_print_st.py::"
DETAIL_ST = "tests/st/torchair_print_detail_st.py::"


def _lines(text: str) -> list[str]:
    """The non-blank lines of ``text``, stripped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _printed(fn, *args) -> tuple[list[str], object]:
    """Call ``fn(*args)``; return the non-blank stdout lines and the result."""
    with capture_stdout() as out:
        result = fn(*args)
    return _lines(out.getvalue()), result


def _backend(name: str):
    return "aot_eager" if name == "aot_eager" else torchair.get_npu_backend()


BACKENDS = pytest.mark.parametrize("backend", ["aot_eager", "airstream"])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Shared helper functions would otherwise pile up recompiles past Dynamo's limit (and then
    run eagerly without notice)."""
    torch.compiler.reset()
    yield


class _GraphSpy:
    """A ``post_grad_custom_pre_pass`` that records the ``air.print`` nodes it sees."""

    def __init__(self) -> None:
        self.calls = 0
        self.prints: list[tuple] = []

    def __call__(self, gm, example_inputs, compile_config) -> None:
        self.calls += 1
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.air.print.default:
                self.prints.append(node.args)

    def backend(self):
        config = CompilerConfig()
        config.post_grad_custom_pre_pass = self
        return torchair.get_npu_backend(compiler_config=config)


# --- torchair_print_st.py -------------------------------------------------------------------


def _three_prints(size: int):
    def func(v):
        torchair.ops.npu_print("x =", v, summarize_size=size)
        v = torch.abs(v)
        torchair.ops.npu_print("abs(x) =", v, summarize_size=size)
        v = torch.add(v, 1)
        torchair.ops.npu_print("add(abs(x), 1) =", v, summarize_size=size)
        return v

    return func


@upstream(PRINT_ST + "test_summarize_1")
@BACKENDS
def test_summarize_1(backend):
    func = _three_prints(1)
    t = torch.neg(torch.ones(10, 10, dtype=torch.bfloat16))
    expected = [
        "x = [[-1 ... -1]",
        "...",
        "[-1 ... -1]]",
        "abs(x) = [[1 ... 1]",
        "...",
        "[1 ... 1]]",
        "add(abs(x), 1) = [[2 ... 2]",
        "...",
        "[2 ... 2]]",
    ]

    eager_lines, eager_out = _printed(func, t)
    assert eager_lines == expected

    compiled_lines, compiled_out = _printed(torch.compile(func, backend=_backend(backend)), t)
    assert compiled_lines == expected
    torch.testing.assert_close(compiled_out, eager_out)


@upstream(PRINT_ST + "test_summarize_neg1")
@BACKENDS
def test_summarize_neg1(backend):
    func = _three_prints(-1)
    t = torch.neg(torch.ones(2, 2, dtype=torch.bfloat16))
    expected = [
        "x = [[-1 -1]",
        "[-1 -1]]",
        "abs(x) = [[1 1]",
        "[1 1]]",
        "add(abs(x), 1) = [[2 2]",
        "[2 2]]",
    ]

    eager_lines, eager_out = _printed(func, t)
    assert eager_lines == expected

    compiled_lines, compiled_out = _printed(torch.compile(func, backend=_backend(backend)), t)
    assert compiled_lines == expected
    torch.testing.assert_close(compiled_out, eager_out)


@upstream(PRINT_ST + "test_inplace_after_print")
@BACKENDS
def test_inplace_after_print(backend):
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1)
        v.add_(1)
        torchair.ops.npu_print(v, summarize_size=-1)
        return v

    t = torch.arange(2, dtype=torch.bfloat16)
    lines, out = _printed(torch.compile(func, backend=_backend(backend)), t)
    # the first print sees the value before the in-place add, the second after it
    assert lines == ["[0 1]", "[1 2]"]
    torch.testing.assert_close(t, torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    torch.testing.assert_close(out, t)


@upstream(PRINT_ST + "test_side_effect_print")
@BACKENDS
def test_side_effect_print(backend):
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1)

    t = torch.arange(2, dtype=torch.bfloat16)
    lines, out = _printed(torch.compile(func, backend=_backend(backend)), t)
    # a graph with no outputs still prints
    assert lines == ["[0 1]"]
    assert out is None


@upstream(PRINT_ST + "test_scalar_print")
@BACKENDS
def test_scalar_print(backend):
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1)

    compiled = torch.compile(func, backend=_backend(backend))
    for value, expected in [
        (torch.tensor(2.5), "2.5"),
        (torch.tensor(3), "3"),
        (torch.tensor(True), "1"),
    ]:
        lines, _ = _printed(compiled, value)
        assert lines == [expected]


@upstream(PRINT_ST + "test_bool_print")
@BACKENDS
def test_bool_print(backend):
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1)

    lines, _ = _printed(torch.compile(func, backend=_backend(backend)), torch.tensor([True, False]))
    assert lines == ["[1 0]"]


@upstream(PRINT_ST + "test_npu_backend")
def test_npu_backend():
    def func(v):
        torchair.ops.npu_print("x =", v)
        return torch.abs(v)

    t = torch.neg(torch.ones(10, 10, dtype=torch.bfloat16))
    spy = _GraphSpy()
    lines, out = _printed(torch.compile(func, backend=spy.backend()), t)

    # the print reaches the backend's graph as an op (upstream: its GE converter runs)
    assert len(spy.prints) == 1
    assert lines[0] == "x = [[-1 -1 -1 ... -1 -1 -1]"
    assert len(lines) == 7
    torch.testing.assert_close(out, torch.abs(t))


@upstream(PRINT_ST + "test_npu_backend_with_inplace")
def test_npu_backend_with_inplace():
    def func(v):
        torchair.ops.npu_print(v)
        v.add_(1)
        return v

    config = CompilerConfig()
    with capture_warnings():  # airstream notes that this NPU-only option is ignored
        config.experimental_config.pattern_fusion_pass = False
    compiled = torch.compile(func, backend=torchair.get_npu_backend(compiler_config=config))

    t = torch.ones((2, 2))
    lines, out = _printed(compiled, t)
    assert lines == ["[[1 1]", "[1 1]]"]
    torch.testing.assert_close(t, torch.full((2, 2), 2.0))
    torch.testing.assert_close(out, t)


@upstream(PRINT_ST + "test_invalid_summarize")
def test_invalid_summarize():
    with pytest.raises(ValueError):
        torchair.ops.npu_print("x =", torch.ones(2, 2), summarize_size=0)
    with pytest.raises(ValueError):
        torchair.ops.npu_print("x =", torch.ones(2, 2), summarize_size=-2)
    with pytest.raises(TypeError):
        torchair.ops.npu_print("x =", torch.ones(2, 2), summarize_size=3.2)


# --- torchair_print_detail_st.py ------------------------------------------------------------


def _detail():
    """A new function each time, so every test compiles its own."""

    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1, tensor_detail=True)

    return func


@upstream(DETAIL_ST + "test_scalar_print_detail")
@BACKENDS
def test_scalar_print_detail(backend):
    compiled = torch.compile(_detail(), backend=_backend(backend))
    cases = [
        (torch.tensor(2.5), "tensor(2.5, shape=[], dtype=torch.float32)"),
        (torch.tensor(3), "tensor(3, shape=[], dtype=torch.int64)"),
        (torch.tensor(True), "tensor(1, shape=[], dtype=torch.bool)"),
    ]
    for value, expected in cases:
        lines, _ = _printed(compiled, value)
        assert lines == [expected]


@upstream(DETAIL_ST + "test_bool_print_detail")
@BACKENDS
def test_bool_print_detail(backend):
    compiled = torch.compile(_detail(), backend=_backend(backend))
    lines, _ = _printed(compiled, torch.tensor([True, False]))
    assert lines == ["tensor([1 0], shape=[2], dtype=torch.bool)"]


@upstream(DETAIL_ST + "test_empty_print_detail")
@BACKENDS
def test_empty_print_detail(backend):
    compiled = torch.compile(_detail(), backend=_backend(backend))
    lines, _ = _printed(compiled, torch.empty((0, 3), dtype=torch.int32))
    assert lines == ["tensor([], shape=[0, 3], dtype=torch.int32)"]


@upstream(DETAIL_ST + "test_npu_backend_detail")
def test_npu_backend_detail():
    def func(v):
        torchair.ops.npu_print("x =", v, tensor_detail=True)
        return torch.abs(v)

    t = torch.neg(torch.ones(10, 10, dtype=torch.bfloat16))
    spy = _GraphSpy()
    lines, out = _printed(torch.compile(func, backend=spy.backend()), t)

    # the op's format string (its second argument) holds the detail template
    assert len(spy.prints) == 1
    assert spy.prints[0][1] == "x = tensor({}, shape={}, dtype=torch.bfloat16)"
    assert lines[0] == "x = tensor([[-1 -1 -1 ... -1 -1 -1]"
    assert lines[-1] == "[-1 -1 -1 ... -1 -1 -1]], shape=[10, 10], dtype=torch.bfloat16)"
    torch.testing.assert_close(out, torch.abs(t))


@upstream(DETAIL_ST + "test_tensor_detail_invalid_int")
def test_tensor_detail_invalid_int():
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1, tensor_detail=1)

    compiled = torch.compile(func, backend="aot_eager")
    with pytest.raises(TypeError) as info:
        compiled(torch.empty((0, 3), dtype=torch.int32))
    assert str(info.value) == "tensor_detail must be bool, got int"


@upstream(DETAIL_ST + "test_tensor_detail_invalid_str")
def test_tensor_detail_invalid_str():
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1, tensor_detail="True")

    compiled = torch.compile(func, backend="aot_eager")
    with pytest.raises(TypeError) as info:
        compiled(torch.empty((0, 3), dtype=torch.int32))
    assert str(info.value) == "tensor_detail must be bool, got str"


@upstream(DETAIL_ST + "test_npu_backend_detail_invalid_str")
def test_npu_backend_detail_invalid_str():
    def func(v):
        torchair.ops.npu_print("x =", v, tensor_detail="True")
        return torch.abs(v)

    t = torch.neg(torch.ones(10, 10, dtype=torch.bfloat16))
    spy = _GraphSpy()
    compiled = torch.compile(func, backend=spy.backend())
    with pytest.raises(TypeError) as info:
        compiled(t)
    assert str(info.value) == "tensor_detail must be bool, got str"
    # the check fails while tracing: no print op reaches the backend
    assert spy.prints == []
