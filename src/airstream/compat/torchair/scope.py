"""``torchair.scope``: stream switching and scope attributes for model code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from airstream.ops.library import STREAM_LABEL_KEY, STREAM_PRIORITY_KEY

__all__ = [
    "data_dump",
    "limit_core_num",
    "npu_stream_switch",
    "npu_wait_tensor",
    "op_never_timeout",
    "super_kernel",
]


@contextlib.contextmanager
def _scope(keys: list[str], values: list[str]) -> Iterator[None]:
    torch.ops.air.scope_enter(keys, values)
    try:
        yield
    finally:
        torch.ops.air.scope_exit()


def npu_stream_switch(
    stream_tag: str, stream_priority: int = 0, enable_inner_parallel: bool = True
) -> contextlib.AbstractContextManager[None]:
    """Run the ops inside on stream ``stream_tag`` (scope markers, traced by Dynamo).

    ``enable_inner_parallel`` steers NPU core sharing: no effect here."""
    if not isinstance(stream_tag, str) or not stream_tag:
        raise ValueError(
            f"npu_stream_switch: stream_tag must be a non-empty str, got {stream_tag!r}"
        )
    return _scope(
        [STREAM_LABEL_KEY, STREAM_PRIORITY_KEY, "_enable_inner_parallel"],
        [stream_tag, str(stream_priority), str(bool(enable_inner_parallel))],
    )


def npu_wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """``self``, with every consumer ordered after ``dependency``'s producer."""
    return torch.ops.air.wait_tensor(self, dependency)


def super_kernel(scope: str | None, options: str = "") -> contextlib.AbstractContextManager[None]:
    """TorchAir's super-kernel fusion scope: kept as a scope attribute, no effect off the NPU.

    ``scope=None`` is ``""``, as in TorchAir (where an empty scope opts the ops inside out of an
    enclosing super kernel)."""
    return _scope(["_super_kernel_scope", "_super_kernel_options"], [scope or "", options])


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int) -> Any:
    """NPU core limits: kept as scope attributes, no effect off the NPU."""
    return _scope(
        ["_op_aicore_num", "_op_vectorcore_num"], [str(op_aicore_num), str(op_vectorcore_num)]
    )


def op_never_timeout(enable: bool = True) -> Any:
    """NPU op timeout switch: kept as a scope attribute, no effect off the NPU. ``enable`` must
    be a bool (TorchAir's check and wording: ``1`` and ``"True"`` raise ``TypeError``)."""
    if not isinstance(enable, bool):
        raise TypeError(
            f"op_never_timeout() argument 'enable' must be bool, but got {type(enable).__name__}."
        )
    return _scope(["_op_exec_never_timeout"], [str(enable)])


def data_dump() -> Any:
    """Mark the ops inside for GE's data dump: kept as a scope attribute
    (``torchair_enable_data_dump``), no effect off the NPU."""
    return _scope(["torchair_enable_data_dump"], ["True"])
