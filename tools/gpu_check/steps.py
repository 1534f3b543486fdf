"""The steps of a GPU check: each one's command and time limit, in the order they run, the budget
they share, and what each needs (packages, pieces of the machine)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
SCRIPT = ROOT / "tools" / "gpu-check"
BUDGET_S = 400  # the whole run; with one rerun and the machine's start, inside a 15-minute loan
# Each step's time limit on a GPU, in the order the steps run: the most important evidence
# first, the benchmarks last. A dry run (2 shared CPU cores in CI) gets DRY_SCALE times each.
LIMITS: dict[str, int] = {
    "preflight": 15,
    "install": 20,
    "test-tools": 10,
    "environment": 20,
    "trace": 40,
    "cuda-tests": 90,
    "cuda-sanitizer": 40,
    "weights-by-address": 20,
    "baseline": 45,
    "bench-moe": 30,
    "bench-branches-pointwise": 25,
    "bench-decode": 30,
}
DRY_SCALE = 4  # CI runs it beside pip installs: bench-decode took 50 s of 60 at 2x
MIN_FILE_S = 5  # left of a test step's limit: enough to start another file
GRACE_S = 3  # of a step's limit: to finish after SIGINT (pytest writes its JUnit report)
TEST_TOOLS = ("pytest", "hypothesis")  # the cuda tests' runner; the tests' conftest imports both
# The Python packages beyond torch and airstream that a step needs: missing, the step is skipped
# and excused (bench decode builds transformers models; the install step's own tools).
REQUIRES: dict[str, tuple[str, ...]] = {
    "install": ("pip", "setuptools"),
    "bench-decode": ("transformers",),
}
# What of the machine a step needs (preflight's names), on a GPU and in a dry run: Inductor's
# CUDA kernels are Triton's, whose launcher is built with a C compiler and Python.h; on CPU,
# Inductor's kernels are C++.
INDUCTOR_GPU = ("Triton", "C compiler", "Python.h")
INDUCTOR_CPU = ("C++ compiler", "Python.h")
NEEDS: dict[str, tuple[str, ...]] = {
    name: INDUCTOR_GPU for name in ("trace", "baseline", "bench-moe", "bench-branches-pointwise")
}
NEEDS["bench-decode"] = INDUCTOR_GPU
DRY_NEEDS: dict[str, tuple[str, ...]] = {
    name: INDUCTOR_CPU for name in ("trace", "bench-moe", "bench-branches-pointwise")
}
DRY_NEEDS["bench-decode"] = INDUCTOR_CPU  # airstream's default on CPU: Inductor segments
DRY_SKIPS = {  # steps a dry run cannot run on CPU (excused there)
    "cuda-sanitizer": "dry run: torch's CUDA sanitizer needs a CUDA build of torch and a GPU",
    "weights-by-address": "dry run: needs CUDA graphs",
}
# the cuda test files most about streams: first in both passes (the sanitizer's limit may end)
STREAM_TEST_FILES = ("tests/test_cuda_runtime.py", "tests/test_torch_streams_cuda.py")
NCCL_TEST_FILE = "tests/test_cuda_nccl.py"  # one rank over a HashStore: offline
CUDA_MARK = re.compile(r"^[^#\n]*\bpytest\.mark\.cuda\b", re.MULTILINE)
PLAIN_OUTPUT = ("install",)  # text, not a JSON report
WHEELS_HINT = (
    "carry wheels: where there is a network, `pip download -d wheels --only-binary=:all: "
    f"--python-version {sys.version_info.major}.{sys.version_info.minor} --platform "
    "manylinux2014_x86_64 pytest hypothesis`, put wheels/ in the checkout, and run "
    "tools/gpu-check --wheels wheels OUT"
)


def limits(dry: bool) -> dict[str, int]:
    return {name: limit * (DRY_SCALE if dry else 1) for name, limit in LIMITS.items()}


def planned(dry: bool, out: Path) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit in seconds) of each step, in the order they run. test-tools
    runs here (no command); cuda-tests and cuda-sanitizer run their command once per file."""
    py, me = sys.executable, str(SCRIPT)
    device = "cpu" if dry else "cuda"
    # dry run: the smallest sizes that run every code path; on a GPU: enough rounds for medians
    small = ["--rounds", "1", "--calls", "1", "--tokens", "2", "--hidden", "64"] if dry else []
    small = small or ["--rounds", "5", "--calls", "3"]
    decode = ["--models", "llama", "--no-inductor", "--rounds", "1", "--calls", "1"]
    decode = decode if dry else ["--models", "qwen2-moe", "--no-inductor", "--rounds", "5"]
    bench = [py, "-m", "airstream", "bench"]
    tests = [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-rfEs"]
    install = [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    install += ["--no-index", "--disable-pip-version-check", "-e", str(ROOT)]
    commands: dict[str, list[str]] = {
        "preflight": [py, me, "--preflight"],
        "install": install,
        "test-tools": [],
        "environment": [py, "-m", "airstream", "doctor", "--json"],
        "trace": [py, me, "--trace", str(out / "trace.json"), "--device", device],
        "cuda-tests": tests,
        "cuda-sanitizer": [*tests, "-p", "gpu_check_csan", "-o", "junit_logging=system-err"],
        "weights-by-address": [py, ".ci/gpu_check.py"],
        "baseline": [py, me, "--baseline", "--device", device],
        "bench-moe": [*bench, "moe", "--device", device, "--json", *small],
        "bench-branches-pointwise": [
            *bench,
            "branches-pointwise",
            "--no-compile-time",
            "--device",
            device,
            "--json",
            *small,
        ],
        "bench-decode": [*bench, "decode", "--device", device, "--json", *decode],
    }
    limit = limits(dry)
    return [(name, commands[name], limit[name]) for name in LIMITS]


def cuda_test_files(root: Path = ROOT) -> list[str]:
    """The test files with ``cuda``-marked tests, relative to ``root``: the stream files and
    the NCCL file first, then the rest in name order."""
    found = sorted(
        path.relative_to(root).as_posix()
        for path in (root / "tests").rglob("test_*.py")
        if CUDA_MARK.search(path.read_text(errors="replace"))
    )
    first = [name for name in (*STREAM_TEST_FILES, NCCL_TEST_FILE) if name in found]
    return first + [name for name in found if name not in first]
