"""``torchair.inference``: ``set_dim_gears`` and ``cache_compile``.

``set_dim_gears`` checks its argument as TorchAir does and marks the dims dynamic (the gears
themselves pick GE graphs, which do not exist here). ``cache_compile`` and ``readable_cache``
are airstream's on-disk compile cache in TorchAir's layout (:mod:`.cache`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from airstream import torch_internals
from airstream.compat.torchair.cache import cache_compile, readable_cache

__all__ = ["cache_compile", "readable_cache", "set_dim_gears"]


def _check_gears(t: torch.Tensor, dim_gears: Mapping[Any, Any]) -> None:
    for dim, gears in dim_gears.items():
        if not isinstance(dim, int):
            raise AssertionError(f"Dim index in dim_gears must be an integer, but got {type(dim)}.")
        if not 0 <= dim < t.dim():
            raise AssertionError(
                f"Dim index in dim_gears must be in range [0, {t.dim() - 1}], but got {dim}."
            )
        if not isinstance(gears, (list, tuple)):
            raise AssertionError(
                f"Gears for dim index {dim} in dim_gears must be a list or tuple, "
                f"but got {type(gears)}."
            )
        for i, gear in enumerate(gears):
            if not isinstance(gear, int):
                raise AssertionError(
                    f"Element at index {i} of value for dim index {dim} in dim_gears must be "
                    f"an integer, but got {type(gear)}."
                )
            if gear == 0:
                raise AssertionError(
                    f"Gear value at index {i} for dim index {dim} must not be 0, but got {gear}."
                )
        if not 2 <= len(gears) <= 100:
            raise AssertionError(
                f"Length of gears for dim index {dim} in dim_gears must be in range [2, 100], "
                f"but got {len(gears)}."
            )


def set_dim_gears(t: torch.Tensor, dim_gears: dict[int, list[int] | tuple[int, ...]]) -> None:
    """Declare the sizes (gears) each dim of ``t`` takes; the dims become dynamic. Setting
    different gears on the same tensor again raises ``AssertionError``."""
    torch_internals.require("torchair")
    current = getattr(t, "dim_gears", None)
    if current is not None and current != dim_gears:
        raise AssertionError(
            f"Tensor {t} already has set dim gears, and it is not supported to set it again."
        )
    _check_gears(t, dim_gears)
    for dim in dim_gears:
        torch_internals.mark_dynamic(t, dim)
    t.dim_gears = dim_gears  # type: ignore[attr-defined]
