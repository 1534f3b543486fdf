"""The ``airstream`` command: demo output, and the installed console script."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import slow

from airstream import torch_internals
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


def _console_script() -> str | None:
    """The ``airstream`` script of this interpreter's environment (or on PATH)."""
    beside = Path(sys.executable).parent / "airstream"
    return str(beside) if beside.exists() else shutil.which("airstream")


def test_console_script_is_installed(tmp_path: Path) -> None:
    exe = _console_script()
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


@slow(
    "a fresh process",
    "tests/test_openmp.py::test_airstream_run_starts_once_with_the_short_spin",
)
def test_module_entry() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "airstream.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and "demo" in result.stdout and "doctor" in result.stdout
    # nothing else: a missing dependency (numpy: torch.compile warns at import without it) or a
    # torch outside the supported range would show here first
    assert result.stderr == "", result.stderr


@pytest.mark.torch_api
def test_doctor_reports_versions_support_and_parts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"torch             {torch.__version__}" in out
    count = len(torch_internals.FEATURES)
    assert f"torch internals: {count} of {count} private APIs present" in out
    assert f"supported ({torch_internals.SUPPORTED_TORCH};" in out
    for heading in (
        "cores",
        "intra-op",
        "OpenMP",
        "wait policy",
        "CUDA",
        "C++ compiler",
        "Graphviz",
        "torch.distributed",
        "test tools",
    ):
        assert heading in out, heading
    assert out.rstrip().endswith("(paste this whole output into bug reports)")


@pytest.mark.torch_api
def test_doctor_json_and_a_missing_private_api(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is True and report["features"] == []
    assert report["cpu"]["intra_op_threads"] == torch.get_num_threads()
    parts = {p["name"]: p for p in report["parts"]}
    assert set(parts) == {
        "CUDA",
        "Triton",
        "C++ compiler",
        "Graphviz",
        "torch.distributed",
        "test tools",
    }
    assert parts["Graphviz"]["ok"] == (shutil.which("dot") is not None)
    assert parts["CUDA"]["ok"] == torch.cuda.is_available()

    def moved() -> None:
        raise AttributeError("module 'torch._functorch' has no attribute 'config'")

    feature = torch_internals.FEATURES["partitioner"]
    monkeypatch.setitem(
        torch_internals.FEATURES, "partitioner", dataclasses.replace(feature, probe=moved)
    )
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "MISSING functorch.compile.min_cut_rematerialization_partition" in out
    assert "needed for every torch.compile with airstream: AttributeError" in out
    assert "airstream's core does NOT work on this torch" in out


@pytest.mark.torch_api
def test_doctor_on_an_untested_torch_with_every_api(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the range but nothing missing: said plainly, and not an error."""
    monkeypatch.setattr(
        torch_internals,
        "support_problem",
        lambda version=None: "airstream supports ...; this is torch 2.16.0",
    )
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "UNSUPPORTED: airstream supports ...; this is torch 2.16.0" in out
    assert "core APIs are present, but this torch is outside the tested range" in out


def test_selftest_models_names_an_unknown_architecture_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from airstream.cli import main

    assert main(["selftest", "models", "--archs", "lama"]) == 2
    err = capsys.readouterr().err
    assert "unknown architecture or configuration ['lama']" in err and "Traceback" not in err
