"""Ports of TorchAir's ``tests/st/torchair_fx_pattern_st.py``: which no-op nodes the optimized FX
graph still holds.

Upstream hooks ``GeConcreteGraph.__call__`` to read the FX graph GE receives after TorchAir's
passes. Here the graph is read at the same point of airstream's pipeline: a
``post_grad_custom_post_pass`` (TorchAir's public option) runs after every built-in pass, so it
sees the optimized graph before max-autotune fuses segments into Inductor kernels (which hides
the aten targets of ``backend.graphs[-1].graph_module``). Every test also checks that the
compiled graph is an inference graph and that the result equals eager PyTorch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from tests.torchair.conftest import upstream
from torchair.configs.compiler_config import CompilerConfig

import torchair

aten = torch.ops.aten
ST = "tests/st/torchair_fx_pattern_st.py::"

GAP = (
    "surface gap: airstream's remove_noop_ops only drops alias views (view, reshape, expand, "
    "full slice, identity permute, alias); TorchAir's also drops {}"
)


def _optimized_ops(fn: Any, *args: Any, remove_noop_ops: bool | None = None) -> Counter:
    """Compile ``fn`` (dynamic shapes, as upstream), check it against eager, and count the
    ``call_function`` targets of the graph airstream's passes produced."""
    config = CompilerConfig()
    if remove_noop_ops is not None:
        config.experimental_config.remove_noop_ops = remove_noop_ops
    seen: list[Counter] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any, cfg: Any) -> None:
        seen.append(Counter(n.target for n in gm.graph.nodes if n.op == "call_function"))

    config.post_grad_custom_post_pass = record
    backend = torchair.get_npu_backend(compiler_config=config)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    got = compiled(*(a.clone() for a in args))
    want = fn(*(a.clone() for a in args))
    torch.testing.assert_close(got, want)
    assert len(seen) == 1 and len(backend.graphs) == 1
    assert backend.graphs[-1].kind == "inference"
    return seen[-1]


def _by_packet(ops: Counter, packet: Any) -> int:
    """How many nodes call any overload of ``packet``."""
    return sum(n for target, n in ops.items() if getattr(target, "overloadpacket", None) is packet)


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 2), torch.randn(2, 2)


@upstream(ST + "test_disable_remove_noop_ops")
def test_disable_remove_noop_ops() -> None:
    def fn(x, y):
        return x[:] + y[:]

    ops = _optimized_ops(fn, *_pair(), remove_noop_ops=False)
    # with the pass switched off, the full-range slices survive
    assert _by_packet(ops, aten.slice) == 2
    assert ops[aten.add.Tensor] == 1


@upstream(ST + "test_enable_remove_noop_ops_slice")
def test_enable_remove_noop_ops_slice() -> None:
    def fn(x, y):
        return x[:] + y[:]

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.slice) == 0
    assert ops[aten.add.Tensor] == 1


@upstream(ST + "test_enable_remove_noop_ops_slice_scatter")
def test_enable_remove_noop_ops_slice_scatter() -> None:
    def fn(x, y):
        return x.slice_scatter(y) + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.slice_scatter) == 0


@upstream(ST + "test_enable_remove_noop_ops_repeat")
def test_enable_remove_noop_ops_repeat() -> None:
    def fn(x, y):
        return x.repeat(1, 1) + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.repeat) == 0


@upstream(ST + "test_enable_remove_noop_ops_pad")
def test_enable_remove_noop_ops_pad() -> None:
    def fn(x, y):
        return F.pad(x, pad=[0, 0, 0, 0], value=3.5) + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.constant_pad_nd) == 0


@upstream(ST + "test_enable_remove_noop_ops_convert")
def test_enable_remove_noop_ops_convert() -> None:
    def fn(x, y):
        return torch.ops.prims.convert_element_type(x, torch.float32) + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, torch.ops.prims.convert_element_type) == 0


@upstream(ST + "test_enable_remove_noop_ops_ceil")
def test_enable_remove_noop_ops_ceil() -> None:
    def fn(x, y):
        return torch.ceil(x) + y

    # integer inputs: rounding up is the identity
    ops = _optimized_ops(fn, torch.tensor([2, 2]), torch.tensor([2, 2]))
    assert _by_packet(ops, aten.ceil) == 0


@upstream(ST + "test_enable_remove_noop_ops_pow")
def test_enable_remove_noop_ops_pow() -> None:
    def fn(x, y):
        return torch.pow(x, 1) + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.pow) == 0


@upstream(ST + "test_enable_remove_noop_ops_cat")
def test_enable_remove_noop_ops_cat() -> None:
    def fn(x, y):
        return torch.cat([x], dim=0) + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.cat) == 0


@upstream(ST + "test_enable_remove_noop_ops_clone")
def test_enable_remove_noop_ops_clone() -> None:
    def fn(x, y):
        return x.clone() + y

    ops = _optimized_ops(fn, *_pair())
    assert _by_packet(ops, aten.clone) == 0


@upstream(ST + "test_enable_remove_noop_ops_clone_skipped")
def test_enable_remove_noop_ops_clone_skipped() -> None:
    def fn(x, y):
        return x.clone()

    x, y = _pair()
    ops = _optimized_ops(fn, x, y)
    # the clone is the graph's output: dropping it would hand the caller its own input back
    assert _by_packet(ops, aten.clone) == 1
    out = torch.compile(fn, backend=torchair.get_npu_backend(), dynamic=True)(x, y)
    assert out.data_ptr() != x.data_ptr()


@upstream(ST + "test_enable_remove_noop_ops_clone_inplace")
def test_enable_remove_noop_ops_clone_inplace() -> None:
    def fn(x, y):
        x_ = x.clone()
        x_.add_(1)
        return y + x_

    x, y = _pair()
    x_before = x.clone()
    ops = _optimized_ops(fn, x, y)
    torch.testing.assert_close(x, x_before)  # the caller's x is not touched
    assert _by_packet(ops, aten.clone) == 0


@upstream(ST + "test_pattern_pass_batchmatmul_transpose_for_ge")
def test_pattern_pass_batchmatmul_transpose_for_ge() -> None:
    def fn(x1, x2):
        return torch.matmul(x1, x2).transpose(1, 0)

    x1 = torch.randn(64, 4, 512, dtype=torch.float16)
    x2 = torch.randn(64, 512, 128, dtype=torch.float16)
    ops = _optimized_ops(fn, x1, x2)
    # the batched matmul stays a plain bmm (no fused matmul+transpose op replaces it)
    assert ops[aten.bmm.default] == 1
