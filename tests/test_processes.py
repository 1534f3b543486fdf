"""A compiled two-stream model after os.fork, in multiprocessing's fork and spawn workers and in
DataLoader workers: the same results, streams still concurrent, and no hang (each case runs in
its own interpreter under a time limit; tests/process_cases.py has the cases)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import slow

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX processes")

_ROOT = Path(__file__).resolve().parents[1]
_FORK = "tests/test_processes.py::test_a_compiled_model_runs_in_its_processes"


@pytest.mark.parametrize(
    ("case", "handoff"),
    [
        ("fork", "auto"),
        pytest.param("fork", "locks", marks=slow("another process", _FORK)),
        pytest.param("multiprocessing", "auto", marks=slow("a pool and a spawned process", _FORK)),
        pytest.param("dataloader", "auto", marks=slow("two DataLoader workers", _FORK)),
    ],
)
def test_a_compiled_model_runs_in_its_processes(case: str, handoff: str) -> None:
    env = dict(os.environ, AIRSTREAM_HANDOFF=handoff)
    env.pop("AIRSTREAM_MODE", None)  # the mode users get (tests/conftest.py pins another)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.process_cases", case],
            cwd=_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=480,  # each process's own watchdog ends it first, with its stacks
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{case} hung past the time limit:\n{error.stdout}\n{error.stderr}")
    assert done.returncode == 0, f"{case} failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    assert done.stdout.strip().endswith(f"{case}: ok")
