"""Tensor layouts as the compiled code reads them: when two strides lay a value out alike, and
the dense order of a layout. A stride matters only in a dimension of more than one element
(Inductor's input checks skip the others too); sizes are read at their example values
(``torch_internals.size_hint``, no guard), so a symbolic shape is never pinned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from airstream import torch_internals

__all__ = ["dense_order", "hints", "same_layout", "same_layout_as"]


def hints(values: Sequence[Any]) -> tuple[int, ...]:
    """Sizes or strides at their example values."""
    return tuple(torch_internals.size_hint(v) for v in values)


def same_layout(shape: Sequence[Any], got: Sequence[Any], want: Sequence[Any]) -> bool:
    """Whether strides ``got`` and ``want`` lay out a tensor of ``shape`` alike: equal in every
    dimension of more than one element."""
    sizes = hints(shape)
    return all(
        size <= 1 or g == w for size, g, w in zip(sizes, hints(got), hints(want), strict=True)
    )


def same_layout_as(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether tensors (or their fake values) ``a`` and ``b`` have one shape and lay it out
    alike."""
    return hints(a.shape) == hints(b.shape) and same_layout(a.shape, a.stride(), b.stride())


def dense_order(shape: Sequence[Any], stride: Sequence[Any]) -> list[int] | None:
    """The dimensions of a dense layout from outermost to innermost, or None if ``stride`` is
    not dense (a broadcast dimension, gaps): no fresh tensor has such strides."""
    sizes, strides = hints(shape), hints(stride)
    order = sorted(range(len(sizes)), key=lambda d: (strides[d], sizes[d]), reverse=True)
    expected = 1
    for dim in reversed(order):
        if sizes[dim] == 1:
            continue
        if strides[dim] != expected:
            return None
        expected *= sizes[dim]
    return order
