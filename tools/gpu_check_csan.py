"""pytest plugin for tools/gpu-check's cuda-sanitizer pass (``-p gpu_check_csan``, tools/ on
PYTHONPATH, TORCH_CUDA_SANITIZER=1).

torch's CUDA sanitizer is a TorchDispatchMode entered when torch is imported, and torch.compile
runs eager under a dispatch mode: airstream would compile nothing, and the sanitizer would check
eager code only. A mode whose ``ignore_compile_internals()`` is True is instead switched off while
torch.compile compiles and on while the compiled code runs: this plugin makes the sanitizer's mode
such a mode, so that it sees the aten calls airstream's compiled code makes on its streams
(kernels Inductor or Triton launch, and CUDA graph replays, stay out of its sight). It writes what
it did to the file named by GPU_CHECK_CSAN_NOTE, for gpu-check's report.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["sanitize_compiled_code"]


def dispatch_mode_base() -> Any:
    """torch's ``TorchDispatchMode`` (the base of the sanitizer's mode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def sanitize_compiled_code(sanitizer: Any = None, mode_base: Any = None) -> str:
    """Make the CUDA sanitizer's mode run under torch.compile's compiled code; return a line
    saying what the sanitizer checks. ``sanitizer`` and ``mode_base`` (torch's
    ``cuda_sanitizer`` and ``TorchDispatchMode`` when None) are there for tests."""
    if sanitizer is None:
        import torch  # imports and enables the sanitizer where TORCH_CUDA_SANITIZER is set

        csan = sys.modules.get("torch.cuda._sanitizer")  # importing it starts GPU tracing
        if csan is None or not torch.cuda.is_available():
            return "CUDA sanitizer: off (TORCH_CUDA_SANITIZER unset when torch was imported)"
        sanitizer = csan.cuda_sanitizer
    if mode_base is None:
        mode_base = dispatch_mode_base()
    if not sanitizer.enabled:
        return "CUDA sanitizer: off (TORCH_CUDA_SANITIZER was not set when torch was imported)"
    if not hasattr(mode_base, "ignore_compile_internals"):
        return (
            "CUDA sanitizer: on, but this torch's torch.compile runs eager under it: airstream's "
            "compiled code is not checked"
        )
    mode = sanitizer.dispatch
    if not mode.ignore_compile_internals():
        sanitizer.disable()  # leave the mode stack (and torch's flags) as they were
        mode.__class__ = type(
            "CompiledCodeCUDASanitizerMode",
            (type(mode),),
            {"ignore_compile_internals": classmethod(lambda cls: True)},
        )
        sanitizer.enable()
    return (
        "CUDA sanitizer: on; torch.compile compiles with it off and runs the compiled code under "
        "it (aten calls seen; Triton kernels and CUDA graph replays not)"
    )


def pytest_configure(config: Any) -> None:
    note = sanitize_compiled_code()
    path = os.environ.get("GPU_CHECK_CSAN_NOTE")
    if path:
        with open(path, "w") as file:
            file.write(note + "\n")


def pytest_report_header(config: Any) -> str:
    return sanitize_compiled_code()
