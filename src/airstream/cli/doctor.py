"""``airstream doctor``: what a bug report needs, and what each optional part of airstream requires.

Versions (airstream, torch and its build, Python, numpy), whether this torch is in the supported
range and has every private API airstream uses (``torch_internals``), the CPU (cores, intra-op
threads, the OpenMP runtime and its wait policy), and one line per optional part: CUDA, Triton, a
C++ compiler for max-autotune, Graphviz, torch.distributed and the test tools. A missing part says
what stops working without it and how to install it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from airstream import torch_internals
from airstream.bench.calibrate import costs_lines, costs_report
from airstream.machine.openmp import OPENMP_VARIABLES, openmp, release_costs
from airstream.runtime.handoff import describe as describe_handoff

__all__ = ["Part", "Report", "collect", "format_report"]


@dataclass(frozen=True)
class Part:
    """One optional part: ``ok`` if present; ``found`` says what is there, ``needed_for`` what
    uses it, ``without`` what happens when it is missing and ``install`` how to get it."""

    name: str
    ok: bool
    found: str
    needed_for: str
    without: str = ""
    install: str = ""


@dataclass
class Report:
    """Everything ``airstream doctor`` found."""

    versions: dict[str, str] = field(default_factory=dict)
    supported: str | None = None  # why this torch is outside the supported range, else None
    features: list[dict[str, str]] = field(default_factory=list)  # the missing private APIs
    feature_count: int = 0
    cpu: dict[str, Any] = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)
    stream_costs: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """airstream's core can work: every private torch API it needs at import and for every
        compile is present (an untested torch with all of them counts)."""
        return not any(f["group"] in ("import", "core") for f in self.features)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["healthy"] = self.healthy
        return out


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(command: list[str]) -> str:
    """The first non-empty output line of ``command`` (stdout, else stderr), or ``""``."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _torch_build() -> str:
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda} build"
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip} build"
    return "CPU build"


def _versions() -> dict[str, str]:
    import airstream

    return {
        "airstream": f"{airstream.__version__} ({os.path.dirname(airstream.__file__)})",
        "torch": f"{torch.__version__} ({_torch_build()}, {os.path.dirname(torch.__file__)})",
        "python": f"{platform.python_version()} ({platform.python_implementation()}, "
        f"{sys.executable})",
        "platform": platform.platform(),
        "numpy": _version("numpy") or "not installed",
    }


def _cpu() -> dict[str, Any]:
    info = torch.__config__.parallel_info()
    backend = re.search(r"ATen parallel backend: (.+)", info)
    version = re.search(r"OpenMP (\d+)(?: \(a\.k\.a\. OpenMP ([\d.]+)\))?", info)
    omp = openmp()
    library = os.path.basename(omp.library) if omp.library else None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "parallel_backend": backend.group(1).strip() if backend else "unknown",
        "openmp": (
            f"{omp.runtime} ({library}), OpenMP {version.group(2) or version.group(1)}"
            if version
            else "not used"
        ),
        "handoff": describe_handoff(),
        "openmp_default_wait": omp.idle,
        "openmp_policy": omp.policy,
        "openmp_release": (
            "before each multi-stream call on worker threads, airstream releases the caller's "
            "idle OpenMP threads"
            if omp.can_release and omp.spins_long
            else "not needed: idle threads spin briefly"
            if omp.can_release
            else "not available (no omp_pause_resource_all)"
        ),
        "openmp_release_costs_us": release_costs() if omp.can_release and omp.spins_long else {},
        "environment": {name: os.environ.get(name, "unset") for name in OPENMP_VARIABLES},
    }


def _gpu_build() -> bool:
    return bool(torch.version.cuda or getattr(torch.version, "hip", None))


def _cuda() -> Part:
    needed = "the CUDA runtime (CUDA streams and events, CUDA graphs), Triton segments"
    install = (
        "on a machine with an NVIDIA GPU and driver: pip install "
        f"'torch{torch_internals.SUPPORTED_TORCH}' from the default index (its Linux wheels are "
        "the CUDA build)"
    )
    if not _gpu_build():
        return Part(
            "CUDA",
            False,
            f"none: this is torch's {_torch_build()}",
            needed,
            "compiled graphs run on CPU (a thread per stream)",
            install,
        )
    if not torch.cuda.is_available():
        return Part(
            "CUDA",
            False,
            f"{_torch_build()}, but no GPU is visible",
            needed,
            "compiled graphs run on CPU (a thread per stream)",
            "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES",
        )
    devices = ", ".join(
        f"cuda:{i} {torch.cuda.get_device_name(i)} "
        f"(compute capability {'.'.join(map(str, torch.cuda.get_device_capability(i)))})"
        for i in range(torch.cuda.device_count())
    )
    return Part("CUDA", True, f"{_torch_build()}; {devices}", needed)


def _triton() -> Part:
    version = _version("triton")
    needed = 'mode="max-autotune" on CUDA (Inductor\'s GPU kernels)'
    if version:
        return Part("Triton", True, f"triton {version}", needed)
    if not _gpu_build():
        return Part("Triton", True, "not needed on a CPU build", needed)
    return Part(
        "Triton",
        False,
        "not installed",
        needed,
        "max-autotune segments on CUDA cannot compile and run as aten code",
        "pip install triton (torch's CUDA wheels normally bring it)",
    )


def _cpp_compiler() -> Part:
    needed = 'mode="max-autotune" on CPU (Inductor builds C++ kernels)'
    try:
        command = torch_internals.inductor_cpp_compiler()
    except Exception as exc:  # a torch without the probe: report, do not fail the doctor
        return Part("C++ compiler", False, f"cannot ask Inductor: {exc}", needed)
    path = shutil.which(command)
    if path is None:
        return Part(
            "C++ compiler",
            False,
            f"{command!r} (Inductor's choice; $CXX overrides) is not on PATH",
            needed,
            "max-autotune segments cannot compile and run as aten code, one warning each "
            "(an error with debug.strict_max_autotune)",
            "apt-get install g++ (Debian/Ubuntu), dnf install gcc-c++ (Fedora), "
            "xcode-select --install (macOS)",
        )
    return Part("C++ compiler", True, _first_line([path, "--version"]) or path, needed)


def _graphviz() -> Part:
    needed = 'debug.graph_dump.type = "svg" (graph dumps as pictures)'
    path = shutil.which("dot")
    if path is None:
        return Part(
            "Graphviz",
            False,
            "`dot` is not on PATH",
            needed,
            "svg dumps are written as .dot files instead, with one notice per process",
            "apt-get install graphviz (Debian/Ubuntu), brew install graphviz (macOS), "
            "conda install graphviz",
        )
    return Part("Graphviz", True, _first_line([path, "-V"]) or path, needed)


def _distributed() -> Part:
    needed = "torch.distributed collectives in compiled graphs, `airstream bench tp`"
    if not torch.distributed.is_available():
        return Part(
            "torch.distributed",
            False,
            "this torch build has no torch.distributed",
            needed,
            "graphs with collectives cannot be traced",
            "a torch build with distributed support (the PyPI and CPU-index wheels)",
        )
    backends = [
        name
        for name, check in (
            ("gloo", torch.distributed.is_gloo_available),
            ("nccl", torch.distributed.is_nccl_available),
        )
        if check()
    ]
    return Part("torch.distributed", True, "backends: " + (", ".join(backends) or "none"), needed)


def _test_tools() -> Part:
    wanted = ("pytest", "hypothesis", "expecttest", "ruff")
    found = {name: _version(name) for name in wanted}
    missing = [name for name, version in found.items() if version is None]
    text = ", ".join(f"{n} {v}" for n, v in found.items() if v) or "none"
    if missing:
        return Part(
            "test tools",
            False,
            f"{text}; missing: {', '.join(missing)}",
            "running airstream's tests",
            "the README's test command (ruff check . && python -m pytest -q) cannot run",
            'pip install -e ".[test]" in a checkout of airstream',
        )
    return Part("test tools", True, text, "running airstream's tests")


def collect(recalibrate: bool = False) -> Report:
    """Everything ``airstream doctor`` reports; ``recalibrate``: measure the stream costs anew."""
    results = torch_internals.probe_all()
    missing = [
        {
            "feature": r.feature.name,
            "api": r.feature.api,
            "group": r.feature.group,
            "needed_for": torch_internals.GROUPS[r.feature.group],
            "problem": str(r.problem),
            "install": f"pip install {r.package}" if r.package else "",
        }
        for r in results
        if r.problem is not None
    ]
    return Report(
        versions=_versions(),
        supported=torch_internals.support_problem(),
        features=missing,
        feature_count=len(results),
        cpu=_cpu(),
        parts=[_cuda(), _triton(), _cpp_compiler(), _graphviz(), _distributed(), _test_tools()],
        stream_costs=costs_report(recalibrate),
    )


def format_report(report: Report) -> str:
    """The report as text for a terminal or a bug report."""
    lines = ["airstream doctor", ""]
    for name, value in report.versions.items():
        lines.append(f"  {name:<18}{value}")
    supported = torch_internals.SUPPORTED_TORCH
    tested = ", ".join(torch_internals.TESTED_TORCH)
    lines.append(
        f"  {'torch support':<18}"
        + (
            f"supported ({supported}; tested {tested})"
            if report.supported is None
            else f"UNSUPPORTED: {report.supported}"
        )
    )
    present = report.feature_count - len(report.features)
    lines += ["", f"torch internals: {present} of {report.feature_count} private APIs present"]
    for f in report.features:
        lines.append(f"  MISSING {f['api']}")
        lines.append(f"          needed for {f['needed_for']}: {f['problem']}")
        if f["install"]:
            lines.append(f"          install: {f['install']}")
    cpu = report.cpu
    lines += [
        "",
        "cpu",
        f"  {'cores':<18}{cpu['cores']} ({cpu['usable_cores']} usable by this process)",
        f"  {'threads':<18}{cpu['intra_op_threads']} intra-op, {cpu['inter_op_threads']} "
        "inter-op (torch.get_num_threads, get_num_interop_threads)",
        f"  {'parallel backend':<18}{cpu['parallel_backend']}",
        f"  {'stream handoff':<18}{cpu['handoff']}",
        f"  {'OpenMP':<18}{cpu['openmp']}",
        f"  {'wait policy':<18}"
        + ", ".join(f"{k}={v}" for k, v in cpu["environment"].items())
        + f" (default: {cpu['openmp_default_wait']})",
        f"  {'in force':<18}{cpu['openmp_policy']}",
        f"  {'idle threads':<18}{cpu['openmp_release']}",
        *(
            [
                f"  {'':<18}(stream_config.release_openmp_threads); it costs "
                "{release:.0f} us per call after the caller's own torch work and {restart:.0f} us "
                "to its next parallel op".format(**cpu["openmp_release_costs_us"]),
                f"  {'':<18}cheaper for processes you start: GOMP_SPINCOUNT=10000 (`airstream "
                "run` sets it; docs/compiling.md: OpenMP)",
            ]
            if cpu["openmp_release_costs_us"]
            else []
        ),
        "",
        "stream costs (what auto_streams decides with)",
        *costs_lines(report.stream_costs),
        "",
        "optional parts",
    ]
    for part in report.parts:
        lines.append(f"  {'ok' if part.ok else 'no':<8}{part.name:<19}{part.found}")
        lines.append(f"  {'':<8}{'':<19}for {part.needed_for}")
        if not part.ok and part.without:
            lines.append(f"  {'':<8}{'':<19}without it: {part.without}")
        if not part.ok and part.install:
            lines.append(f"  {'':<8}{'':<19}install: {part.install}")
    if not report.healthy:
        verdict = "airstream's core does NOT work on this torch (MISSING above)"
    elif report.supported is not None:
        verdict = "airstream's core APIs are present, but this torch is outside the tested range"
    else:
        verdict = "airstream works: a supported torch with every private API it needs"
    lines += ["", verdict, "(paste this whole output into bug reports)"]
    return "\n".join(lines) + "\n"
