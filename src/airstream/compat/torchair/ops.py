"""``torchair.ops``: record / wait / npu_wait_tensor for model code."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["npu_wait_tensor", "record", "wait"]


def record() -> torch.Tensor:
    """An event token for everything issued so far on the current stream."""
    return torch.ops.air.record()


def wait(tensors: Sequence[torch.Tensor]) -> None:
    """Order later work on the current stream after each token / tensor producer."""
    # TorchAir's wording first (its tests match on it), then what was wrong
    if not isinstance(tensors, (list, tuple)) or len(tensors) == 0:
        raise ValueError(
            "torchair.ops.wait() requires at least one tensor input: a non-empty list of tensors "
            f"(record tokens or data), got {tensors!r}"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                "arguments of torchair.ops.wait() must be torch.Tensor: element "
                f"{i} is {type(t).__name__}"
            )
    torch.ops.air.wait(list(tensors))


def npu_wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """``self``, with every consumer ordered after ``dependency``'s producer."""
    return torch.ops.air.wait_tensor(self, dependency)
