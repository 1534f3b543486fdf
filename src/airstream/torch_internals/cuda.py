"""Private torch CUDA APIs behind ``mode="reduce-overhead"``: undoing a failed graph capture's
allocator state, cuBLAS workspaces around a capture, and the test suite's GPU delay kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airstream.torch_internals.registry import _attr, _feature, _get


@_feature(
    "capture_pool_cleanup",
    "torch._C._cuda_endAllocateToPool(device, pool) and torch._C._cuda_releasePool(device, pool)",
    "cuda-graphs",
    "leaving the caching allocator as it was when a CUDA graph capture fails (torch's own "
    "capture_end skips this when the capture was invalidated)",
)
def _probe_capture_pool_cleanup() -> tuple[Callable[..., None], Callable[..., None]]:
    return _attr("torch._C:_cuda_endAllocateToPool"), _attr("torch._C:_cuda_releasePool")


def end_allocate_to_pool(device: int, pool: Any) -> None:
    """Tell the caching allocator that no capture allocates into ``pool`` on ``device`` any more
    (raises if none did)."""
    _get("capture_pool_cleanup")[0](device, pool)


def release_pool(device: int, pool: Any) -> None:
    """Drop one use of the private memory pool ``pool``; its memory returns once unused."""
    _get("capture_pool_cleanup")[1](device, pool)


def _no_workspaces() -> None:
    """A torch built without CUDA has no cuBLAS workspaces to clear."""


@_feature(
    "cublas_workspaces",
    "torch._C._cuda_clearCublasWorkspaces (on builds with CUDA)",
    "cuda-graphs",
    "keeping cached cuBLAS workspaces out of captured graphs (as Inductor's cudagraph trees do)",
)
def _probe_cublas_workspaces() -> Callable[[], None]:
    if not torch.backends.cuda.is_built():
        return _no_workspaces
    clear: Callable[[], None] = _attr("torch._C:_cuda_clearCublasWorkspaces")
    return clear


def clear_cublas_workspaces() -> None:
    """Free the cuBLAS workspaces torch keeps per stream, so a capture allocates its own inside
    the graph's pool instead of baking in one that eager code goes on using."""
    _get("cublas_workspaces")()


@_feature(
    "cuda_sleep",
    "torch.cuda._sleep(cycles)",
    "testing",
    "the GPU tests' delay kernel, which makes stream races show on every run",
)
def _probe_cuda_sleep() -> Callable[[int], None]:
    sleep: Callable[[int], None] = _attr("torch.cuda:_sleep")
    return sleep


def cuda_sleep(cycles: int) -> None:
    """Queue a kernel on the current CUDA stream that spins for ``cycles`` GPU clock cycles."""
    _get("cuda_sleep")(cycles)


def _data_ptrs_equal_in_python(
    tensors: list[Any], data_ptrs: list[int | None], indices: list[int]
) -> bool:
    """The replay check where torch has no C version of it (builds without CUDA)."""
    return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)


@_feature(
    "replay_checks",
    "torch._C._tensors_data_ptrs_at_indices_equal(tensors, data_ptrs, indices) (on builds with "
    "CUDA; a loop in Python elsewhere) and torch._foreach_copy_(dsts, srcs)",
    "cuda-graphs",
    "a CUDA graph replay's static-input check in one C call and its input copies in one "
    "(as torch's cudagraph trees do)",
)
def _probe_replay_checks() -> tuple[Callable[..., bool], Callable[..., None]]:
    same: Callable[..., bool] = _data_ptrs_equal_in_python
    if torch.backends.cuda.is_built():
        same = _attr("torch._C:_tensors_data_ptrs_at_indices_equal")
    copy: Callable[..., None] = _attr("torch:_foreach_copy_")
    a, b = torch.zeros(2), torch.ones(2)
    if not same([a, b], [a.data_ptr(), b.data_ptr()], [0, 1]) or same([a], [b.data_ptr()], [0]):
        raise RuntimeError("_tensors_data_ptrs_at_indices_equal no longer compares data pointers")
    copy([a], [b])
    if not bool(a.eq(1).all()):
        raise RuntimeError("_foreach_copy_ no longer copies")
    return same, copy


@_feature(
    "storage_use_count",
    "torch._C._storage_Use_Count(storage._cdata)",
    "cuda-graphs",
    "a forward's CUDA graph handing its saved tensors to the backward in place: whether they are "
    "still held before the next replay overwrites them (as torch's cudagraph trees check)",
)
def _probe_storage_use_count() -> Callable[[Any], int]:
    count: Callable[[int], int] = _attr("torch._C:_storage_Use_Count")
    storage = torch.zeros(1).untyped_storage()
    alias = torch.empty(0).set_(storage)
    before = count(storage._cdata)
    del alias
    if count(storage._cdata) != before - 1:
        raise RuntimeError("_storage_Use_Count no longer counts the tensors sharing a storage")
    return lambda s: count(s._cdata)


def storage_use_count(storage: Any) -> int:
    """How many references ``storage`` (an ``UntypedStorage``) has: each tensor using it, each
    Python storage object."""
    return _get("storage_use_count")(storage)


def data_ptrs_equal(tensors: list[Any], data_ptrs: list[int | None], indices: list[int]) -> bool:
    """``tensors[i].data_ptr() == data_ptrs[i]`` for every ``i`` of ``indices``, in one C call."""
    return _get("replay_checks")[0](tensors, data_ptrs, indices)


def foreach_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """``dst.copy_(src)`` for each pair, as one batched op (nothing for empty lists)."""
    if dsts:
        _get("replay_checks")[1](dsts, srcs)
