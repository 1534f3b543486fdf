"""``torchair.inference``: ``set_dim_gears`` and ``cache_compile``.

``set_dim_gears`` checks its argument as TorchAir does and marks the dims dynamic (the gears
themselves pick GE graphs, which do not exist here). ``cache_compile`` compiles with airstream
in this process; TorchAir's on-disk cache (reloading compiled code in a new process) is not
reproduced, and the first call says so once.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from airstream import torch_internals

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


@functools.cache
def _say_no_disk_cache() -> None:
    warnings.warn(
        "airstream.compat.torchair: inference.cache_compile compiles with airstream in this "
        "process; TorchAir's on-disk cache (compiled code reloaded by a new process, cache_dir) "
        "is not reproduced off the NPU, so each process compiles once (this notice appears once)",
        stacklevel=3,
    )


def cache_compile(
    func: Callable[..., Any],
    *,
    config: Any = None,
    dynamic: bool = True,
    cache_dir: str | None = None,
    global_rank: int | None = None,
    tp_rank: int | None = None,
    pp_rank: int | None = None,
    custom_decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    ge_cache: bool = False,
    **kwargs: Any,
) -> Callable[..., Any]:
    """``func`` compiled with airstream and TorchAir's ``config`` (compiled once per process).
    ``ge_cache`` (GE's own compiled-graph cache) has nothing to cache here."""
    from airstream.compat.torchair import get_npu_backend

    if kwargs:
        raise TypeError(f"cache_compile() got unexpected keyword arguments {sorted(kwargs)}")
    _say_no_disk_cache()
    backend = get_npu_backend(compiler_config=config, custom_decompositions=custom_decompositions)
    return torch.compile(func, backend=backend, dynamic=dynamic)


def readable_cache(cache_bin: str, print_output: bool = True, file: str | None = None) -> str:
    """TorchAir's cache reader: there is no on-disk cache here to read."""
    raise NotImplementedError(
        f"torchair.inference.readable_cache({cache_bin!r}): airstream keeps no on-disk compile "
        "cache (cache_compile compiles in the process), so there is no cache file to read"
    )
