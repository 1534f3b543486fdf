"""What a C++ extension needs to build against this torch: its headers, its libraries and the
C++ ABI it was built with.

torch ships its headers in ``torch/include`` and its libraries in ``torch/lib``; the ABI flag
(``torch._C._GLIBCXX_USE_CXX11_ABI``) must match the one libtorch was compiled with, or the
extension's ``std::string`` symbols do not link. torch's own ``torch.utils.cpp_extension`` knows
the same, but imports setuptools, which a venv on Python 3.12 does not have.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from airstream.torch_internals.registry import _feature, _get

__all__ = ["CppBuild", "cpp_build"]


@dataclass(frozen=True)
class CppBuild:
    """Compiler and linker arguments for an extension against this torch."""

    include_dirs: tuple[str, ...]
    library_dir: str
    libraries: tuple[str, ...]
    cxx11_abi: bool

    def flags(self) -> list[str]:
        """The compile and link flags, library directory on the run-time path too."""
        return [
            f"-D_GLIBCXX_USE_CXX11_ABI={int(self.cxx11_abi)}",
            *(f"-I{d}" for d in self.include_dirs),
            f"-L{self.library_dir}",
            f"-Wl,-rpath,{self.library_dir}",
            *(f"-l{name}" for name in self.libraries),
        ]


@_feature(
    "cpp_build",
    "torch/include, torch/lib (libc10, libtorch_cpu) and torch._C._GLIBCXX_USE_CXX11_ABI",
    "thread-state",
    "building the CPU runtime's thread-state extension against this torch",
)
def _probe_cpp_build() -> CppBuild:
    root = os.path.dirname(torch.__file__)
    include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    header = os.path.join(include, "ATen", "ThreadLocalState.h")
    if not os.path.exists(header):
        raise FileNotFoundError(f"{header} (this torch was installed without its headers)")
    return CppBuild((include,), lib, ("c10", "torch_cpu"), bool(torch._C._GLIBCXX_USE_CXX11_ABI))


def cpp_build() -> CppBuild:
    """How to build a C++ extension against this torch; TorchSupportError where it cannot."""
    found: CppBuild = _get("cpp_build")
    return found
