"""The ``airstream`` command: demo output, and the installed console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airstream.cli import main


def test_demo_explains_the_guide_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--size", "16", "--out", ""]) == 0
    out = capsys.readouterr().out
    assert "graph before the custom pre pass" in out and "graph after the custom pre pass" in out
    assert "torch.ops.air.scope_enter.default(['_user_stream_label'], ['stream_1'])" in out
    assert "stream_1  mm = aten.mm.default" in out and "stream_1  abs_1 = aten.abs.default" in out
    assert "main      sub = aten.sub.Tensor" in out
    assert "record->wait: record_default [stream_1] -> wait_default [main]" in out
    assert "equal eager PyTorch (torch.equal, 16x16 input): yes" in out


def test_console_script_is_installed(tmp_path: Path) -> None:
    exe = shutil.which("airstream")
    if exe is None:
        pytest.skip("package not installed with its console script (pip install -e .)")
    result = subprocess.run(
        [exe, "demo", "--size", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "equal eager PyTorch" in result.stdout
    assert (tmp_path / "airstream_demo" / "timeline.svg").exists()


def test_module_entry() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "airstream.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and "demo" in result.stdout
