"""What this machine and this Python have for the GPU steps: the packages a step needs, the
offline install's build tools, the test tools (installed from wheels if need be), and the pieces
of the machine (preflight: CUDA, Triton, compilers, Python.h, NCCL)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from gpu_check import processes, steps


def importable(name: str) -> bool:
    """Can this Python import ``name`` (with --wheels' folder on its path)?"""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_packages(step: str) -> list[str]:
    """The packages ``step`` needs that this Python cannot import."""
    return [name for name in steps.REQUIRES.get(step, ()) if not importable(name)]


def build_problem() -> str | None:
    """Why this Python's setuptools cannot build an editable install offline, or None. Without
    build isolation pip uses what is installed: setuptools >= 70.1 builds wheels itself, 64 to
    70.0 need the wheel package, older ones cannot build editable installs (PEP 660) at all."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("setuptools")
    except PackageNotFoundError:
        return "setuptools is not installed"
    release = tuple(int(part) for part in found.split(".")[:2] if part.isdigit())
    if release >= (70, 1) or (release >= (64, 0) and importable("wheel")):
        return None
    need = "the wheel package beside it" if release >= (64, 0) else "setuptools >= 64 and wheel"
    return f"setuptools {found} here builds an editable install only with {need}"


def externally_managed() -> Path | None:
    """The EXTERNALLY-MANAGED marker (PEP 668) that makes pip refuse to install into this
    Python, or None (a virtual environment is never externally managed)."""
    if sys.prefix != sys.base_prefix:
        return None
    marker = Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED"
    return marker if marker.is_file() else None


def install_wheels(wheels: Path, names: list[str], site: Path, limit: float, log: Path) -> str:
    """Install ``names`` from the wheel files in ``wheels`` into ``site``, offline; return
    pip's last error line ('' when it succeeded)."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links"]
    command += [str(wheels), "--target", str(site), "--disable-pip-version-check"]
    command += ["--no-warn-script-location", *names]
    env = dict(os.environ, PIP_NO_INDEX="1")
    rc, _, stderr, _ = processes.execute(command, limit, log, env)
    if rc == 0:
        return ""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return "timed out" if rc is None else (lines[-1] if lines else f"pip exit {rc}")


def test_tools(wheels: str | None, out: Path, limit: int) -> dict[str, Any]:
    """The test-tools step: pytest and hypothesis importable, from --wheels if need be."""
    begin = time.monotonic()
    step: dict[str, Any] = {"step": "test-tools", "status": "passed"}
    missing = [name for name in steps.TEST_TOOLS if not importable(name)]
    if missing and wheels:
        site = out / "site"
        site.mkdir(exist_ok=True)
        if not importable("pip"):
            step["wheels"] = "pip is not installed here: cannot install wheels"
        else:
            error = install_wheels(Path(wheels), missing, site, limit, out / "test-tools.log")
            step["wheels"] = f"installed {', '.join(missing)} from {wheels} into {site}"
            if error:
                step["wheels"] = f"installing {', '.join(missing)} from {wheels} failed: {error}"
            sys.path.insert(0, str(site))
            importlib.invalidate_caches()
        missing = [name for name in missing if not importable(name)]
    versions: dict[str, str | None] = {}
    for name in steps.TEST_TOOLS:
        try:
            versions[name] = metadata.version(name) if name not in missing else None
        except metadata.PackageNotFoundError:  # importable without metadata
            versions[name] = "unknown"
    step["versions"] = versions
    if missing:
        names = " and ".join(missing)
        why = f"{names} cannot be imported by {sys.executable}: the CUDA tests cannot run; "
        step.update(status="failed", reason=why + steps.WHEELS_HINT, missing=missing)
    step["seconds"] = round(time.monotonic() - begin, 1)
    step["limit"] = limit
    return step


def _which(*names: str) -> str | None:
    """The path of the first of ``names`` found on PATH (an empty name is passed over)."""
    return next((found for name in names if name and (found := shutil.which(name))), None)


def preflight() -> dict[str, Any]:
    """What this machine has for the GPU steps; ``problems``: each missing piece, why."""
    problems: dict[str, str] = {}
    facts: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    import torch

    facts.update(torch=torch.__version__, cuda=torch.version.cuda)
    facts["cuda_available"] = torch.cuda.is_available()
    facts["gpus"] = []
    if facts["cuda_available"]:
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        build = "torch's CPU build" if torch.version.cuda is None else "no device or driver"
        problems["CUDA"] = f"torch.cuda.is_available() is False ({build})"
    try:
        import triton

        facts["triton"] = triton.__version__
    except Exception as error:
        facts["triton"] = None
        problems["Triton"] = f"import triton failed: {type(error).__name__}: {error}"
    try:  # the compiler Inductor's C++ kernels are built with, found as torch finds it
        from torch._inductor.cpp_builder import get_cpp_compiler

        cxx = _which(get_cpp_compiler())
    except Exception:
        cxx = None
    facts["cxx"] = cxx = cxx or _which(os.environ.get("CXX", ""), "g++", "c++", "clang++")
    if cxx is None:
        problems["C++ compiler"] = "none of $CXX, g++, c++, clang++ on PATH"
    facts["cc"] = cc = _which(os.environ.get("CC", ""), "gcc", "clang", "cc")
    if cc is None:
        problems["C compiler"] = "none of $CC, gcc, clang, cc on PATH (Triton builds its launcher)"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    facts["python_h"] = str(header) if header.is_file() else None
    if not header.is_file():
        problems["Python.h"] = f"{header} is missing (install Python's development headers)"
    try:
        import torch.distributed as dist

        facts["nccl"] = bool(dist.is_available() and dist.is_nccl_available())
    except Exception:
        facts["nccl"] = False
    if not facts["nccl"]:
        problems["NCCL"] = "torch.distributed.is_nccl_available() is False"
    facts["problems"] = problems
    return facts
