"""The ``air`` operator namespace: stream scope markers and event ops.

Schemas (fixed by docs/design.md, shared with TorchAir)::

    air::scope_enter(str[] keys, str[] values, bool need_execute=False) -> ()
    air::scope_exit(bool need_execute=False) -> ()
    air::record(*, Device? device=None) -> Tensor
    air::wait(Tensor[] x) -> ()
    air::wait_tensor(Tensor self, Tensor dependency) -> Tensor

Eager kernels are no-ops (eager PyTorch runs everything in program order, so every ordering the
ops ask for already holds), except that ``wait_tensor`` returns a copy of ``self``
(``self.clone()``). Registration makes the compiler keep them: they are side-effectful for FX
dead-code elimination, and the backend tags them so the partitioner never copies them into
backward graphs and CSE never merges them.

Why ``wait_tensor`` keeps its no-alias schema and copies in eager mode: its schema declares no
alias (``Tensor self ... -> Tensor``), so a kernel that returned ``self`` itself broke the contract
that ``torch.library.opcheck`` checks. The alternative, annotating the alias
(``wait_tensor(Tensor(a) self, Tensor dependency) -> Tensor(a)``), is not usable on torch 2.13 or
2.15: ``torch.library.register_autograd`` refuses ops whose outputs alias an input ("non-functional
operator"), and AOTAutograd's functionalization rejects custom ops with alias-annotated outputs, so
``torch.compile`` could not trace it. So the user-visible schema stays the one docs/design.md
fixes, and the eager kernel returns a fresh tensor (fake kernel alike: same shape, strides, dtype
and device as ``self.clone()``). The copy costs eager mode only: compiled graphs never run this
kernel, airstream's executors (``airstream.runtime``) run ``wait_tensor(x, dep)`` as ``x`` (as a
copy only where ``x`` is broadcast or strided, so that its value has the fresh layout its fake
kernel gives it), and ``airstream.graph.effects`` accounts for that by treating the result as an
alias of ``x``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.node import has_side_effect

from airstream.torch_internals import OpOverload, OpOverloadPacket, op_name

__all__ = [
    "AIR_OPS",
    "MARKER_OPS",
    "STREAM_LABEL_KEY",
    "STREAM_PRIORITY_KEY",
    "adopt_air_aliases",
    "air_op_for",
    "is_air_op",
]

STREAM_LABEL_KEY = "_user_stream_label"
STREAM_PRIORITY_KEY = "_user_stream_priority"

_lib = torch.library.Library("air", "DEF")  # the air namespace is ours
_lib.define("scope_enter(str[] keys, str[] values, bool need_execute=False) -> ()")
_lib.define("scope_exit(bool need_execute=False) -> ()")
_lib.define("record(*, Device? device=None) -> Tensor")
_lib.define("wait(Tensor[] x) -> ()")
_lib.define("wait_tensor(Tensor self, Tensor dependency) -> Tensor")


def _scope_enter(keys: Sequence[str], values: Sequence[str], need_execute: bool = False) -> None:
    return None


def _scope_exit(need_execute: bool = False) -> None:
    return None


def _record(*, device: torch.device | None = None) -> torch.Tensor:
    # The token is an empty tensor: cheap, and it gives `wait` a Tensor[] argument to hold.
    return torch.empty(0, device=device)


def _wait(x: Sequence[torch.Tensor]) -> None:
    return None


def _wait_tensor_eager(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    # The schema declares no alias, so the result must not be `self` nor share its storage.
    return self.clone()


def _wait_tensor_fake(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    # A traced graph must not see an output aliasing an input of a non-view op. `empty_like`
    # follows the same memory-format rule as `clone`, so fake and eager strides agree.
    return torch.empty_like(self)


for _name, _eager, _fake in [
    ("scope_enter", _scope_enter, _scope_enter),
    ("scope_exit", _scope_exit, _scope_exit),
    ("record", _record, _record),
    ("wait", _wait, _wait),
    ("wait_tensor", _wait_tensor_eager, _wait_tensor_fake),
]:
    _lib.impl(_name, _eager, "CompositeExplicitAutograd")
    torch.library.register_fake(f"air::{_name}", _fake, lib=_lib)  # type: ignore[arg-type]


def _wait_tensor_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    # wait_tensor is the identity on `self`; `dependency` only orders work.
    return grad, None


torch.library.register_autograd("air::wait_tensor", _wait_tensor_backward, lib=_lib)

scope_enter = torch.ops.air.scope_enter.default
scope_exit = torch.ops.air.scope_exit.default
record = torch.ops.air.record.default
wait = torch.ops.air.wait.default
wait_tensor = torch.ops.air.wait_tensor.default

MARKER_OPS = frozenset({scope_enter, scope_exit})
AIR_OPS = frozenset({scope_enter, scope_exit, record, wait, wait_tensor})

for _op in AIR_OPS:
    has_side_effect(_op)


def is_air_op(target: object) -> bool:
    """True if ``target`` (an FX node target) is one of the ``air`` ops."""
    return target in AIR_OPS


# TorchAir's npugraph_ex package names the same ops torch.ops.npugraph_ex.* (TorchAir e27ea807);
# the compat layer defines them where no torch_npu does, and passes may write either name.
_ALIASED_NAMESPACES = ("npugraph_ex",)
_BY_NAME = {op_name(op)[1]: op for op in AIR_OPS}


def air_op_for(target: object) -> Any:
    """The ``air`` op a node's target stands for when it is not the op itself: another
    namespace's op of the same name (TorchAir's ``npugraph_ex.scope_enter``), or the op's
    packet, written without ``.default`` (``torch.ops.air.scope_enter``); None otherwise."""
    if isinstance(target, OpOverloadPacket):
        target = getattr(target, "default", None)
        if target in AIR_OPS:
            return target
    if not isinstance(target, OpOverload) or target.namespace not in _ALIASED_NAMESPACES:
        return None
    return _BY_NAME.get(op_name(target)[1])


def adopt_air_aliases(graph: torch.fx.Graph) -> int:
    """Call the ``air`` op wherever a node calls its alias; returns how many were changed."""
    changed = 0
    for node in graph.nodes:
        if node.op == "call_function":
            op = air_op_for(node.target)
            if op is not None:
                node.target = op
                changed += 1
    return changed
