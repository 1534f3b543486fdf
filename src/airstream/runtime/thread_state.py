"""The caller's thread-local torch state on the threads that run its side streams.

A side stream's ops run on another thread (a worker, or a thread of the caller's OpenMP team),
and torch keeps much of what an op runs under per thread: grad and inference mode, autocast,
torch function and dispatch modes, saved-tensor hooks, and ``torch.profiler``, which records
only the threads it was started on. Each call captures the caller's state once and runs every
side stream under it (``thread_state.cpp``: torch's own ``at::ThreadLocalState``, as the autograd
engine carries it onto its threads); the thread's own state comes back after the job.

The extension is C++ against torch's headers, compiled once per torch and Python build into
airstream's cache directory (a few seconds, with the C++ compiler Python was built with). Where
it cannot be built, :func:`carrier` returns ``None`` once with a warning, and side streams carry
grad and inference mode only (``torch.profiler`` then sees only the main stream's ops).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from airstream.errors import TorchSupportError
from airstream.machine.cache_dir import cache_root
from airstream.runtime import extension
from airstream.torch_internals import cpp_build, require, set_grad_enabled

__all__ = ["CallerState", "Carrier", "carrier", "run_as_caller"]

_SOURCE_FILE = Path(__file__).with_name("thread_state.cpp")


class Carrier:
    """``capture()``: the calling thread's state; ``run(state, fn, *args)``: ``fn(*args)`` under
    it, on the calling thread."""

    def __init__(self, module: Any) -> None:
        self.capture: Callable[[], Any] = module.capture
        self.run: Callable[..., Any] = module.run


@functools.cache
def carrier() -> Carrier | None:
    """The extension, built on first use; ``None`` where it cannot be built (warned once)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    identity = _SOURCE_FILE.read_text() + sys.version + torch.__version__ + torch.__file__
    key = hashlib.sha1(identity.encode()).hexdigest()[:12]
    target = cache_root() / "thread_state" / key / f"airstream_thread_state{suffix}"
    try:
        require("thread-state")  # torch's headers and libraries, where the build finds them
        if not target.exists():
            extension.build(_SOURCE_FILE, target, "CXX", ["-O2", "-std=c++20"], cpp_build().flags())
        return Carrier(extension.load("airstream_thread_state", target))
    except (OSError, ImportError, subprocess.SubprocessError, TorchSupportError) as error:
        warnings.warn(
            f"airstream: side streams cannot run under the caller's thread state ({error}): "
            "they carry its grad and inference mode only, and torch.profiler sees only the "
            "main stream's ops. Building it needs a C++ compiler (g++) and torch's headers.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


class CallerState(NamedTuple):
    """The thread state a call's side streams run under: the caller's whole torch thread-local
    state (``state``, from the extension), or where that is unavailable its grad and inference
    mode."""

    state: Any
    grad: bool
    inference: bool

    @classmethod
    def capture(cls, with_carrier: Carrier | None) -> CallerState:
        """The calling thread's state, through ``with_carrier`` where there is one."""
        if with_carrier is not None:
            return cls(with_carrier.capture(), False, False)
        return cls(None, torch.is_grad_enabled(), torch.is_inference_mode_enabled())


def run_as_caller(
    with_carrier: Carrier | None, caller: CallerState, fn: Callable[..., Any], *args: Any
) -> None:
    """``fn(*args)`` on this thread under ``caller``'s state (the thread's own comes back after,
    where the carrier restores it; grad mode, per thread, stays as the caller had it)."""
    if with_carrier is not None:
        with_carrier.run(caller.state, fn, *args)
        return
    set_grad_enabled(caller.grad)
    if caller.inference:
        with torch.inference_mode():
            fn(*args)
    else:
        fn(*args)
