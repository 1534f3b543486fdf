"""MKL's per-thread thread count, inside torch's own binary.

torch links MKL into ``libtorch_cpu`` for its matrix multiplies, and MKL keeps its own thread
count: OpenMP's per-thread setting (what the CPU runtime gives each stream's thread) does not
reach it outside a parallel region, so a worker thread's product would still use every core.
``MKL_Set_Num_Threads_Local`` sets the count for the calling thread only (0: follow the
process-wide setting again).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import torch

from airstream.torch_internals.registry import _feature, _get

__all__ = ["mkl_thread_setter"]


def _no_mkl(threads: int) -> int:
    """A torch built without MKL: nothing to set."""
    return 0


@_feature(
    "mkl_local_threads",
    "MKL_Set_Num_Threads_Local in torch/lib/libtorch_cpu (on builds with MKL)",
    "cpu-streams",
    "giving a worker-thread stream's matrix multiplies the stream's intra-op threads",
)
def _probe_mkl_local_threads() -> Callable[[int], int]:
    if not torch.backends.mkl.is_available():
        return _no_mkl
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if not os.path.exists(library):  # not Linux's layout: look in the process's symbols
        handle = ctypes.CDLL(None)
    else:
        handle = ctypes.CDLL(library)
    setter = handle.MKL_Set_Num_Threads_Local
    setter.restype = ctypes.c_int
    setter.argtypes = [ctypes.c_int]
    setter(setter(0))  # read and put back: the calling thread's setting is unchanged
    return setter


def mkl_thread_setter() -> Callable[[int], int]:
    """``set(threads) -> previous``: MKL's thread count for the calling thread (0: the
    process-wide one; a no-op on a torch built without MKL)."""
    setter: Callable[[int], int] = _get("mkl_local_threads")
    return setter
