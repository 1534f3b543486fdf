"""The air ops: schemas, eager behaviour, registration, and the Python wrappers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import airstream
from airstream.ops.library import AIR_OPS
from airstream.torch_internals import op_schema


def test_schemas_match_design() -> None:
    schemas = {str(op_schema(op)) for op in AIR_OPS}
    assert schemas == {
        "air::scope_enter(str[] keys, str[] values, bool need_execute=False) -> ()",
        "air::scope_exit(bool need_execute=False) -> ()",
        "air::record(*, Device? device=None) -> Tensor",
        "air::wait(Tensor[] x) -> ()",
        "air::wait_tensor(Tensor self, Tensor dependency) -> Tensor",
    }


# One sample call per air op for `torch.library.opcheck` (built fresh per test). Every op in
# AIR_OPS needs an entry: test_opcheck_samples_cover_air_ops fails when one is missing.
_OPCHECK_SAMPLES: dict[str, Callable[[], tuple[object, ...]]] = {
    "scope_enter": lambda: (["_user_stream_label"], ["s1"]),
    "scope_exit": lambda: (),
    "record": lambda: (),
    "wait": lambda: ([torch.randn(2)],),
    "wait_tensor": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
}


def _op_name(op: Any) -> str:
    return str(op).split(".")[1]  # air.wait_tensor.default -> wait_tensor


def test_opcheck_samples_cover_air_ops() -> None:
    assert set(_OPCHECK_SAMPLES) == {_op_name(op) for op in AIR_OPS}


@pytest.mark.parametrize("op", sorted(AIR_OPS, key=_op_name), ids=_op_name)
def test_opcheck(op: Any) -> None:
    name = _op_name(op)
    assert name in _OPCHECK_SAMPLES, f"no opcheck sample for air::{name}: add one"
    torch.library.opcheck(op, _OPCHECK_SAMPLES[name]())


def test_opcheck_wait_tensor_keeps_layout() -> None:
    # Fake and eager kernels must agree on strides for non-contiguous inputs too.
    dep = torch.randn(1)
    for x in (torch.randn(3, 4).t(), torch.randn(3, 1).expand(3, 4), torch.randn(4, 6)[:, ::2]):
        torch.library.opcheck(torch.ops.air.wait_tensor.default, (x, dep))


def test_all_air_ops_are_side_effectful() -> None:
    graph = torch.fx.Graph()
    for op in AIR_OPS:
        assert graph.call_function(op).is_impure(), op  # FX dead-code elimination keeps it


def test_eager_ops_are_noops() -> None:
    assert torch.ops.air.scope_enter(["_user_stream_label"], ["s"]) is None
    assert torch.ops.air.scope_exit() is None
    token = torch.ops.air.record()
    assert isinstance(token, torch.Tensor) and token.numel() == 0
    assert torch.ops.air.wait([token]) is None
    t, d = torch.randn(3), torch.randn(2)
    out = torch.ops.air.wait_tensor(t, d)
    # The schema declares no alias, so eager returns an equal tensor with its own storage.
    assert out is not t and out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert torch.equal(out, t)


def test_wait_tensor_is_identity_for_autograd() -> None:
    x = torch.randn(4, requires_grad=True)
    dep = torch.randn(4, requires_grad=True)
    y = airstream.ops.wait_tensor(x * 3, dep)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))
    assert dep.grad is None


def test_wrappers() -> None:
    token = airstream.ops.record()
    airstream.ops.wait([token, torch.ones(1)])
    t = torch.randn(2)
    assert torch.equal(airstream.ops.wait_tensor(t, token), t)


@pytest.mark.parametrize(
    ("arg", "words"),
    [
        ([], r"wait\(\[\]\) waits for nothing"),
        ([torch.ones(1), 3], "element 1 is a int, not a tensor"),
        (torch.ones(1), "takes a list of tensors"),
    ],
)
def test_wait_rejects_bad_lists(arg: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        airstream.ops.wait(arg)  # type: ignore[arg-type]


def test_wait_tensor_rejects_non_tensors() -> None:
    with pytest.raises(ValueError, match="dependency must be a tensor"):
        airstream.ops.wait_tensor(torch.ones(1), 2)  # type: ignore[arg-type]


def test_stream_context_is_noop_in_eager_and_validates() -> None:
    with airstream.stream("s1"):
        y = torch.ones(2) + 1
    assert torch.equal(y, torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="label must be a non-empty str"), airstream.stream(""):
        pass
    with pytest.raises(ValueError, match="priority must be an int"), airstream.stream("s", "hi"):
        pass
