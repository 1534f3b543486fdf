"""``tools/gpu-check``: a step whose Python package is missing is skipped with the reason, and the
run still passes; the offline install refuses to download. (CI runs the whole dry run.)"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check() -> ModuleType:
    path = ROOT / "tools" / "gpu-check"
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(path))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_step_needing_a_missing_package_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    check = _gpu_check()
    say = [sys.executable, "-c", "print('{\"ran\": true}')"]
    monkeypatch.setattr(check, "REQUIRES", {"cuda-tests": ("pytest", "no_such_package_here")})
    monkeypatch.setattr(
        check, "_steps", lambda dry, out: [("cuda-tests", say, 30), ("environment", say, 30)]
    )
    assert check.main(["--dry-run", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["machine"]["missing"] == {"cuda-tests": ["no_such_package_here"]}
    skipped, ran = report["steps"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == "needs no_such_package_here, not installed here"
    assert ran["status"] == "passed" and ran["result"] == {"ran": True}
    out = capsys.readouterr().out
    assert "not installed here: no_such_package_here (the cuda-tests step is skipped)" in out


def test_a_dry_run_runs_the_steps_after_the_first_side_by_side_and_reports_them_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _gpu_check()
    timed = "import json, time; "
    timed += "s = time.time(); time.sleep(0.5); print(json.dumps({'at': [s, time.time()]}))"
    steps = [(name, [sys.executable, "-c", timed], 30) for name in ("environment", "a", "b")]
    monkeypatch.setattr(check, "REQUIRES", {})
    monkeypatch.setattr(check, "_steps", lambda dry, out: steps)
    monkeypatch.setattr(check.os, "cpu_count", lambda: 2)
    assert check.main(["--dry-run", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())["steps"]
    assert [s["step"] for s in report] == ["environment", "a", "b"]
    (_, first_end), (a_start, a_end), (b_start, b_end) = (s["result"]["at"] for s in report)
    assert first_end <= min(a_start, b_start), "the first step (the install) runs alone, first"
    assert a_start < b_end and b_start < a_end, "the others ran side by side"


def test_the_install_step_is_offline_and_keeps_what_is_installed() -> None:
    check = _gpu_check()
    (name, command, _), *_ = check._steps(True, ROOT)
    assert name == "install"
    for flag in ("--no-deps", "--no-build-isolation", "--no-index"):
        assert flag in command
    problem = check.build_problem()
    if problem is not None:  # the step is skipped, saying why (Python's own setuptools 65)
        assert problem.startswith("setuptools ") and "builds an editable install only" in problem
        return
    # pip resolves the same command without reaching any index (what the GPU machine allows)
    done = subprocess.run(
        [*command[:-2], "--dry-run", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PIP_NO_INDEX": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
