"""The mode a graph compiles in: the config's, or for ``mode="default"`` the device's choice.

A user comparing airstream with the backend they have, Inductor, must not find it slower, so the
default is chosen per device by what was measured (``airstream bench decode``, one stream, runners
interleaved; the figures and their conditions are in docs/benchmarks.md, not here):

- **CPU: max-autotune** (Inductor's C++ code for each stream's runs of ops), which runs decode
  steps about as fast as Inductor where reduce-overhead's one aten call per op is slower; it
  costs compile time (each segment is an Inductor compile, cached on disk by Inductor's FX graph
  cache). Where Inductor has no C++ compiler to build with, the default is reduce-overhead, with
  one warning.
- **CUDA (and any device but the CPU): reduce-overhead** (on CUDA the whole multi-stream call
  captured as one CUDA graph): a small
  decode step on a GPU is bound by kernel launches, which a CUDA graph removes and Inductor's
  default code does not. Not yet measured on a GPU.
- With ``debug.run_eagerly`` or a data dump (which run node by node), reduce-overhead: nothing
  to gain from compiling kernels.

``AIRSTREAM_MODE`` sets the mode of every config that leaves ``mode`` at ``"default"``
(reduce-overhead for fast compiles: the test suite sets it), but for run_eagerly and data dumps.
"""

from __future__ import annotations

import functools
import shutil
import warnings

from airstream import torch_internals
from airstream.machine import environment
from airstream.options.config import CompilerConfig

__all__ = ["MODES", "resolve_mode"]

MODES = ("reduce-overhead", "max-autotune")
"""The modes a graph compiles in; ``"default"`` resolves to one of them."""


@functools.cache
def _cpu_compiler_missing() -> str | None:
    """Why Inductor cannot build CPU kernels here, or None if its C++ compiler is on PATH; asked
    once per process, and said in one warning."""
    try:
        command = torch_internals.inductor_cpp_compiler()
    except Exception as exc:  # a torch without the probe, or Inductor failing to choose one
        missing = f"Inductor cannot name its C++ compiler ({exc})"
    else:
        if shutil.which(command) is not None:
            return None
        missing = f"Inductor's C++ compiler {command!r} is not on PATH ($CXX names another)"
    warnings.warn(
        f"airstream: mode='default' on CPU compiles with Inductor's C++ code, but {missing}; "
        "running aten calls instead (mode='reduce-overhead', slower per step). Install a C++ "
        "compiler (`airstream doctor` says how) or set mode='reduce-overhead' to silence this.",
        stacklevel=4,
    )
    return missing


def resolve_mode(config: CompilerConfig, device_type: str) -> str:
    """The mode a graph on ``device_type`` (``"cpu"``, ``"cuda"``) compiles in under ``config``:
    its ``mode`` when set, else ``$AIRSTREAM_MODE``, else the device's default (see the module
    docstring)."""
    mode = str(config.mode)
    if mode != "default":
        return mode
    if config.debug.run_eagerly or config.debug.data_dump.type is not None:
        return "reduce-overhead"  # node by node: no kernels to compile
    chosen = environment.AIRSTREAM_MODE.read()
    if chosen is not None:
        return chosen
    if device_type != "cpu":
        return "reduce-overhead"
    return "reduce-overhead" if _cpu_compiler_missing() is not None else "max-autotune"
