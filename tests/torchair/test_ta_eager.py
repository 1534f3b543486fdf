"""Ports of TorchAir's ``tests/st/torchair_eager_st.py``: ``debug.run_eagerly`` in max-autotune
and reduce-overhead mode, and in-place updates inside ``npu_stream_switch`` scopes.

Upstream's reinplace tests read the logs of TorchAir's aclgraph reinplace passes ("success/failed
for reinplace ...") or wrap its private ``_reinplace_inplaceable_ops_pass`` to count functional
and in-place nodes. Here the same counts are read from the optimized graph airstream runs (its
reinplace passes are on in reduce-overhead, as TorchAir's are), with the stream of each op
(``backend.graphs[-1].streams``), and the result and every in-place update of an input must equal
eager PyTorch's (an unsafe reinplace across streams would corrupt one of them). The custom op's
functional twin is not made in place: upstream registers the pair with TorchAir's private table of
in-place NPU ops, which has no counterpart here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from tests.torchair.conftest import upstream
from torchair.configs.compiler_config import CompilerConfig

import torchair

aten = torch.ops.aten
ST = "tests/st/torchair_eager_st.py::"

# ---------------------------------------------------------------------------------------------
# A custom op with two mutated outputs, functionalized by hand into a functional twin (as
# upstream's stub does), so the graph holds a multi-output functional op whose results are
# written back into two inputs.

_NS = "ta_eager_st"
_lib = torch.library.Library(_NS, "FRAGMENT")
_lib.define("sin_cos_inplace(Tensor x, Tensor(a!) out_sin, Tensor(b!) out_cos) -> Tensor")
_lib.define(
    "sin_cos_functional(Tensor x, Tensor out_sin, Tensor out_cos) -> (Tensor, Tensor, Tensor)"
)


def _sin_cos_inplace(x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor) -> torch.Tensor:
    out_sin.sin_()
    out_cos.cos_()
    return x + 1


def _sin_cos_functional(
    x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, c = out_sin.clone(), out_cos.clone()
    return _ops().sin_cos_inplace(x, s, c), s, c


def _sin_cos_functionalize(
    x: torch.Tensor, out_sin: torch.Tensor, out_cos: torch.Tensor
) -> torch.Tensor:
    for t in (x, out_sin, out_cos):
        torch._sync(t)
    unwrapped = [torch._from_functional_tensor(t) for t in (x, out_sin, out_cos)]
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        res, new_sin, new_cos = _ops().sin_cos_functional(*unwrapped)
    for target, value in ((out_sin, new_sin), (out_cos, new_cos)):
        torch._functionalize_replace(target, value)
        torch._functionalize_commit_update(target)
        torch._sync(target)
    return res


_lib.impl("sin_cos_inplace", _sin_cos_inplace, "CompositeExplicitAutograd")
_lib.impl("sin_cos_inplace", lambda x, s, c: torch.empty_like(x), "Meta")
_lib.impl("sin_cos_inplace", _sin_cos_functionalize, "Functionalize")
_lib.impl("sin_cos_functional", _sin_cos_functional, "CompositeExplicitAutograd")
_lib.impl(
    "sin_cos_functional",
    lambda x, s, c: (torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)),
    "Meta",
)


def _ops() -> Any:
    return getattr(torch.ops, _NS)


# ---------------------------------------------------------------------------------------------


class Model(torch.nn.Module):
    """Two linears and a data-dependent branch (a graph break)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(2, 2)
        self.linear2 = torch.nn.Linear(2, 2)

    def forward(self, x):
        a = self.linear1(x)
        b = self.linear2(x)
        if x.sum() < 0:
            return a + b + 1
        return a + b - 1


def _eager_backend(mode: str | None = None) -> Any:
    config = CompilerConfig()
    if mode is not None:
        config.mode = mode
    config.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=config)


def _check_run_eagerly(mode: str | None, dynamic: bool) -> None:
    torch.manual_seed(0)
    model = Model()
    backend = _eager_backend(mode)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    for x in (torch.randn(3, 2), -torch.ones(3, 2), torch.ones(3, 2)):  # both branches
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(compiled(x).detach(), want)
    assert backend.graphs  # the graphs went through airstream, not around it


def _compare_with_eager(fn: Any, *inputs: torch.Tensor) -> Any:
    """Run ``fn`` compiled (reduce-overhead, run_eagerly, dynamic) and eagerly on copies of
    ``inputs``: the outputs and the inputs (their in-place updates) must agree. Returns the
    compiled graph."""
    backend = _eager_backend("reduce-overhead")
    mine = [t.clone() for t in inputs]
    theirs = [t.clone() for t in inputs]
    got = torch.compile(fn, backend=backend, dynamic=True)(*mine)
    want = fn(*theirs)
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(mine, theirs, equal_nan=True)
    assert len(backend.graphs) == 1 and backend.graphs[0].kind == "inference"
    return backend.graphs[0]


def _streams(compiled: Any, target: Any) -> Counter:
    """How many ``target`` nodes run on each stream (None: the main stream)."""
    nodes = compiled.graph_module.graph.nodes
    return Counter(compiled.streams.stream_of[n.name] for n in nodes if n.target == target)


def _writes_back(compiled: Any) -> Counter:
    """The streams of the copy_ nodes that write results back into mutated graph inputs."""
    return _streams(compiled, aten.copy_.default)


def _three(*shape: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(*shape) for _ in range(3)]


# ---------------------------------------------------------------------------------------------
# debug.run_eagerly


@upstream(ST + "test_ge_eager_mode_dynamic_false")
def test_ge_eager_mode_dynamic_false() -> None:
    _check_run_eagerly(None, dynamic=False)


@upstream(ST + "test_ge_eager_mode_dynamic_true")
def test_ge_eager_mode_dynamic_true() -> None:
    _check_run_eagerly(None, dynamic=True)


@upstream(ST + "test_acl_graph_eager_mode_dynamic_false")
def test_acl_graph_eager_mode_dynamic_false() -> None:
    _check_run_eagerly("reduce-overhead", dynamic=False)


# ---------------------------------------------------------------------------------------------
# in-place updates inside stream scopes


@upstream(ST + "test_aclgraph_single_reinplace_within_mix_stream_scope")
def test_aclgraph_single_reinplace_within_mix_stream_scope() -> None:
    # Upstream: x's update must not be reinplaced (x is also read on the main stream), y's and
    # z's may be. Here: every update lands in its input and each op stays on its scope's stream.
    def fn(x, y, z):
        x2 = x - 1.0
        with torchair.scope.npu_stream_switch("o", 3):
            x.sub_(1.0)
        with torchair.scope.npu_stream_switch("1", 3):
            y.add_(1.0)
            y2 = y - 1.0
        with torchair.scope.npu_stream_switch("2", 3):
            z.mul_(1.0)
        return x2 + y2 + z

    g = _compare_with_eager(fn, *_three(3))
    assert _streams(g, aten.sub.Tensor) == {None: 1, "o": 1, "1": 1}  # x's update: not in place
    assert _writes_back(g) == {None: 1}  # ... so it is copied back; y's and z's are not:
    assert _streams(g, aten.add_.Tensor)["1"] == 1 and _streams(g, aten.mul_.Tensor) == {"2": 1}
    assert g.streams.priorities == {"o": 3, "1": 3, "2": 3}


@upstream(ST + "test_aclgraph_multi_reinplace_within_same_stream_scope")
def test_aclgraph_multi_reinplace_within_same_stream_scope() -> None:
    # Upstream: the two-output custom op may be reinplaced, since every reader of its mutated
    # inputs is on stream "o" with it.
    def fn(x, cos, sin):
        x2 = x - 1.0
        with torchair.scope.npu_stream_switch("o", 3):
            x3 = x2 - sin
            _ops().sin_cos_inplace.default(x3, cos, sin)
            ret = cos + cos
        return ret.sqrt()

    g = _compare_with_eager(fn, *_three(3))
    assert _streams(g, _ops().sin_cos_functional.default) == {"o": 1}
    assert _streams(g, aten.sub.Tensor) == {None: 1}
    assert _streams(g, aten.sub_.Tensor) == {"o": 1}  # x2 - sin into x2: read on "o" only
    assert _streams(g, aten.add.Tensor) == {"o": 1}
    assert _writes_back(g) == {None: 2}  # cos and sin, not x


@upstream(ST + "test_aclgraph_multi_reinplace_within_mix_stream_scope")
def test_aclgraph_multi_reinplace_within_mix_stream_scope() -> None:
    # Upstream: no reinplace of the custom op, its input is made on the main stream.
    def fn(x, cos, sin):
        x2 = x - 1.0
        x3 = x2 - sin
        with torchair.scope.npu_stream_switch("o", 3):
            ret = _ops().sin_cos_inplace.default(x3, cos, sin)
            ret = ret * cos
        return ret.sqrt()

    g = _compare_with_eager(fn, *_three(3))
    assert _streams(g, _ops().sin_cos_functional.default) == {"o": 1}
    assert _streams(g, aten.sub.Tensor) == {None: 1} and _streams(g, aten.sub_.Tensor) == {None: 1}
    assert _streams(g, aten.mul.Tensor) == {"o": 1}
    assert _writes_back(g) == {None: 2}


@upstream(ST + "test_aclgraph_single_reinplace_within_mix_stream_scope_success")
def test_aclgraph_single_reinplace_within_mix_stream_scope_success() -> None:
    # Upstream: every update may be reinplaced (x is updated again on the main stream only
    # after its side-stream update).
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("0", 3):
            x.sub_(1.0)
        with torchair.scope.npu_stream_switch("1", 3):
            y.add_(1.0)
            y2 = y - 1.0
        with torchair.scope.npu_stream_switch("2", 3):
            z.mul_(1.0)
        x.add_(3)
        return x + y2 + z

    g = _compare_with_eager(fn, *_three(3))
    assert _streams(g, aten.sub.Tensor) == {"0": 1, "1": 1}
    # y's and z's updates in place on their streams; x's second update in place on the main
    # stream (on x's first update, made on "0"), then copied back into x
    assert _streams(g, aten.add_.Tensor) == {"1": 1, None: 2}
    assert _streams(g, aten.mul_.Tensor) == {"2": 1}
    assert _writes_back(g) == {None: 1}


@upstream(ST + "test_aclgraph_multi_reinplace_within_mix_stream_scope_success")
def test_aclgraph_multi_reinplace_within_mix_stream_scope_success() -> None:
    def fn(x, cos, sin):
        x.mul_(2)
        with torchair.scope.npu_stream_switch("o", 3):
            _ops().sin_cos_inplace.default(x, cos, sin)
            ret = cos + cos
        return ret.sqrt()

    g = _compare_with_eager(fn, *_three(3))
    assert _streams(g, _ops().sin_cos_functional.default) == {"o": 1}
    assert _streams(g, aten.mul_.Tensor) == {None: 1}  # x.mul_(2): in place on x
    assert _streams(g, aten.add.Tensor) == {"o": 1}
    assert _writes_back(g) == {None: 2}  # cos and sin


@upstream(ST + "test_aclgraph_multi_reinplace_within_mix_stream_scope_fail")
def test_aclgraph_multi_reinplace_within_mix_stream_scope_fail() -> None:
    # Upstream: the custom op must stay functional, its mutated input cos is read on the main
    # stream afterwards.
    def fn(x, cos, sin):
        x.mul_(2)
        with torchair.scope.npu_stream_switch("o", 3):
            ret = _ops().sin_cos_inplace.default(x, cos, sin)
            ret = ret * cos
        res = ret.sqrt()
        after = cos + 1
        return res, after

    g = _compare_with_eager(fn, *_three(3))
    assert _streams(g, _ops().sin_cos_functional.default) == {"o": 1}
    assert _streams(g, aten.mul_.Tensor) == {None: 1} and _streams(g, aten.mul.Tensor) == {"o": 1}
    assert _streams(g, aten.add.Tensor) == {None: 1}
    assert _writes_back(g) == {None: 2}


@upstream(ST + "test_aclgraph_single_reinplace_with_multi_stream_scope_success")
def test_aclgraph_single_reinplace_with_multi_stream_scope_success() -> None:
    # Upstream: 2 add.Tensor before its reinplace pass, 1 add_.Tensor after.
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x2 = x + 1.0
            x3 = x2 + 2.0
        return x3.view(-1)

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add.Tensor) == {"1": 1}  # of 2, as upstream
    assert _streams(g, aten.add_.Tensor) == {"1": 1}
    assert _writes_back(g) == {}


@upstream(ST + "test_aclgraph_single_reinplace_with_multi_stream_scope_failed")
def test_aclgraph_single_reinplace_with_multi_stream_scope_failed() -> None:
    # Upstream: 4 add.Tensor before its reinplace pass, only 1 reinplaced (x2 is read on both
    # streams).
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x2 = x + 1.0
            x3 = x2 + 2.0
        x4 = x2 + 1.0
        return x4 + x3

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add.Tensor) == {"1": 2, None: 1}  # of 4, one in place, as upstream
    assert _streams(g, aten.add_.Tensor) == {None: 1}


@upstream(ST + "test_aclgraph_single_reinplace_with_multi_streams_scope_success")
def test_aclgraph_single_reinplace_with_multi_streams_scope_success() -> None:
    # Upstream: 3 add.Tensor before its reinplace pass, 1 add_.Tensor after.
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x2 = x + 1.0
            x3 = x2 + 2.0
        with torchair.scope.npu_stream_switch("2", 3):
            x3 = x3 + 2.0
        return x3.view(-1)

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add.Tensor) == {"1": 1, "2": 1}  # of 3, one in place, as upstream
    assert _streams(g, aten.add_.Tensor) == {"1": 1}


@upstream(ST + "test_aclgraph_single_reinplace_with_multi_streams_scope_failed_1")
def test_aclgraph_single_reinplace_with_multi_streams_scope_failed_1() -> None:
    # Upstream: 3 add.Tensor, none reinplaced (x2 is read on two side streams).
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x2 = x + 1.0
            x3 = x2 + 2.0
        with torchair.scope.npu_stream_switch("2", 3):
            x4 = x2 + 2.0
        return x4.view(-1), x3

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add.Tensor) == {"1": 2, "2": 1}


@upstream(ST + "test_aclgraph_single_reinplace_with_multi_streams_scope_failed_2")
def test_aclgraph_single_reinplace_with_multi_streams_scope_failed_2() -> None:
    # Upstream: 4 add.Tensor, none reinplaced (x2 and x3 are read on other streams).
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x2 = x + 1.0
            x3 = x2 + 2.0
        with torchair.scope.npu_stream_switch("2", 3):
            x4 = x3 + 2.0
        return x2 + x3, x4

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add.Tensor) == {"1": 2, "2": 1, None: 1}


@upstream(ST + "test_aclgraph_single_mutated_reinplace_with_multi_stream_scope_success")
def test_aclgraph_single_mutated_reinplace_with_multi_stream_scope_success() -> None:
    # Upstream: log says x's add may be reinplaced (no reader on another stream).
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x.add_(1.0)
        return x.view(-1)

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add_.Tensor) == {"1": 1}  # x written in place, on its stream
    assert _writes_back(g) == {}


@upstream(ST + "test_aclgraph_single_mutated_reinplace_with_multi_stream_scope_failed")
def test_aclgraph_single_mutated_reinplace_with_multi_stream_scope_failed() -> None:
    # Upstream: the main-stream mul is reinplaced, the side-stream add is not (its result is
    # read on the main stream); both checked by pass-wrapper counts and log lines.
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x.add_(1.0)
        return x.mul_(2.0)

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add.Tensor) == {"1": 1}  # not in place: x is read on main after
    assert _streams(g, aten.mul_.Tensor) == {None: 1}  # in place on the add's result
    assert _writes_back(g) == {None: 1}


@upstream(ST + "test_aclgraph_single_mutated_reinplace_with_multi_stream_scope_has_stream_label")
def test_aclgraph_single_mutated_reinplace_with_multi_stream_scope_has_stream_label() -> None:
    # Upstream (pattern_fusion_pass off, so stream labels are on the nodes before reinplace):
    # the main-stream mul is reinplaced. Here: the option is accepted, the labels are right,
    # and the mul writes the side stream's result in place on the main stream.
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x.add_(1.0)
        x5 = x.mul_(2.0)
        return x5 + 1

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.run_eagerly = True
    config.experimental_config.pattern_fusion_pass = False
    backend = torchair.get_npu_backend(compiler_config=config)
    mine, theirs = _three(3, 3), _three(3, 3)
    got = torch.compile(fn, backend=backend, dynamic=True)(*mine)
    torch.testing.assert_close(got, fn(*theirs))
    torch.testing.assert_close(mine, theirs)
    g = backend.graphs[-1]
    assert _streams(g, aten.add.Tensor) == {"1": 1, None: 1}
    assert _streams(g, aten.mul_.Tensor) == {None: 1}


@upstream(ST + "test_aclgraph_single_mutated_reinplace_with_multi_streams_scope_success")
def test_aclgraph_single_mutated_reinplace_with_multi_streams_scope_success() -> None:
    # Upstream: both adds may be reinplaced and the mul becomes mul_ (pass-wrapper count and
    # log lines).
    def fn(x, y, z):
        with torchair.scope.npu_stream_switch("1", 3):
            x.add_(1.0)
        with torchair.scope.npu_stream_switch("2", 3):
            y.add_(x)
            y.mul_(2.0)
        return x.view(-1)

    g = _compare_with_eager(fn, *_three(3, 3))
    assert _streams(g, aten.add_.Tensor) == {"1": 1}  # x.add_ in place, on its stream
    assert _streams(g, aten.add.Tensor) == {"2": 1}
    assert _streams(g, aten.mul_.Tensor) == {"2": 1}  # y's final value, then copied into y
    assert _writes_back(g) == {None: 1}
