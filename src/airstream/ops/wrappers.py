"""Python wrappers of the event ops, for model code: ``airstream.ops.record/wait/wait_tensor``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["record", "wait", "wait_tensor"]


def record(device: torch.device | str | None = None) -> torch.Tensor:
    """Record an event on the current stream and return its token.

    ``wait([token])`` on another stream orders the work issued after the wait behind everything
    issued on this stream up to this call.
    """
    return torch.ops.air.record(device=torch.device(device) if device is not None else None)


def wait(tensors: Sequence[torch.Tensor]) -> None:
    """Order the work issued after this call on the current stream after each of ``tensors``.

    Each element is a token from :func:`record` (wait for everything recorded) or any tensor
    (wait for its producer).
    """
    if not isinstance(tensors, (list, tuple)):
        raise ValueError(
            f"airstream.ops.wait takes a list of tensors (record tokens or data), "
            f"got {type(tensors).__name__}"
        )
    if len(tensors) == 0:
        raise ValueError(
            "airstream.ops.wait([]) waits for nothing: pass the tokens from "
            "airstream.ops.record() or the tensors whose producers must finish first"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"airstream.ops.wait: element {i} is a {type(t).__name__}, not a tensor; "
                "pass record tokens or tensors"
            )
    torch.ops.air.wait(list(tensors))


def wait_tensor(tensor: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """Return ``tensor``; every consumer of the result starts after ``dependency`` is produced."""
    for what, t in (("tensor", tensor), ("dependency", dependency)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"airstream.ops.wait_tensor: {what} must be a tensor, got {type(t).__name__}"
            )
    return torch.ops.air.wait_tensor(tensor, dependency)
