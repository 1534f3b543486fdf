"""Stream costs measured on this machine: measured once in a child process, cached per machine
and torch version, shown by ``airstream doctor``, and used by ``auto_streams``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from tests.conftest import slow

from airstream.cli import main
from airstream.machine import calibration
from airstream.machine.calibration import NOMINAL, MachineCosts, machine_costs


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("AIRSTREAM_COSTS", raising=False)
    monkeypatch.setattr(calibration, "_memo", {})
    monkeypatch.setattr(calibration, "_warned", set())
    return tmp_path / "calibration.json"


@slow(
    "a real measurement in a child process (5-10 s alone, 30 s beside other tests)",
    "tests/test_calibration.py::test_another_torch_or_thread_count_is_measured_anew",
)
def test_measured_once_then_read_from_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    costs = machine_costs()
    assert costs.source.startswith("measured ")
    assert 1e-7 < costs.dispatch_seconds < 1e-3
    assert 1e-6 < costs.side_stream_seconds < 1e-2  # a real handoff to a worker thread
    for slowdown in (costs.overlap_slowdown, costs.mixed_slowdown, costs.host_slowdown):
        assert 1.0 <= slowdown <= 2.0
    assert costs.bytes_per_second > 1e8 and costs.flops_per_second > 1e8
    entries = json.loads(cache.read_text())
    (entry,) = entries.values()
    assert entry["identity"]["torch"] == torch.__version__
    assert entry["identity"]["intra_op_threads"] == torch.get_num_threads()
    assert MachineCosts(**entry["costs"]) == costs

    def no_measuring(threads: int) -> MachineCosts:
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(calibration, "_measure_in_child", no_measuring)
    monkeypatch.setattr(calibration, "_memo", {})  # a new process: only the file remains
    assert machine_costs() == costs


def test_another_torch_or_thread_count_is_measured_anew(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[int] = []

    def fake(threads: int) -> MachineCosts:
        measured.append(threads)
        return MachineCosts(1e-6, 1e10, 1e11, 5e-5, 2e-5, 1.5, 1.1, 2.0, f"measured fake {threads}")

    monkeypatch.setattr(calibration, "_measure_in_child", fake)
    first = machine_costs()
    assert machine_costs() is first and len(measured) == 1
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    machine_costs()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        machine_costs()
    finally:
        torch.set_num_threads(threads)
    assert len(measured) == 3 and len(json.loads(cache.read_text())) == 3
    machine_costs(recalibrate=True)
    assert len(measured) == 4


def test_a_failed_measurement_warns_once_and_uses_nominal_figures(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(threads: int) -> MachineCosts:
        raise RuntimeError("the calibration process failed: ImportError: no module")

    monkeypatch.setattr(calibration, "_measure_in_child", broken)
    with pytest.warns(UserWarning, match="could not measure stream costs on this machine"):
        assert machine_costs() is NOMINAL
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert machine_costs() is NOMINAL  # once per process, not per compile


def test_modes(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine_costs("nominal") is NOMINAL
    monkeypatch.setenv("AIRSTREAM_COSTS", "nominal")
    assert machine_costs() is NOMINAL
    with pytest.raises(ValueError, match="must be 'measured' or 'nominal', got 'fast'"):
        machine_costs("fast")
    from airstream import passes

    with pytest.raises(ValueError, match="auto_streams: costs must be 'measured', 'nominal'"):
        passes.auto_streams(costs="fast")


def test_doctor_shows_the_figures_and_recalibrates(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[int] = []

    def fake(threads: int) -> MachineCosts:
        calls.append(threads)
        return MachineCosts(
            4e-6, 1.1e10, 1.9e11, 7.5e-5, 3.5e-5, 1.62, 1.04, 1.97, "measured 2026-11-30"
        )

    monkeypatch.setattr(calibration, "_measure_in_child", fake)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "stream costs (what auto_streams decides with)" in out
    assert f"measured 2026-11-30 on this machine, cached in {cache}" in out
    assert "75 us per call (handoff and join), 35 us per further wait" in out
    assert "matrix multiply 1.62x beside a matrix multiply, 1.04x beside small ops" in out
    assert "small ops 1.97x beside small ops" in out
    assert main(["doctor", "--recalibrate", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stream_costs"]["overlap_slowdown"] == 1.62 and len(calls) == 2
    monkeypatch.setenv("AIRSTREAM_COSTS", "nominal")
    assert main(["doctor"]) == 0
    assert "fixed nominal figures (AIRSTREAM_COSTS=nominal)" in capsys.readouterr().out


def test_processes_starting_together_measure_once(tmp_path: Path) -> None:
    """Ranks of one job compiling at once: one measures, the others wait and read its figures
    (measured side by side, each would see the others' load and get different ones). Each
    process's measurement is a stand-in that takes a second and names its process, so equal
    figures everywhere mean one process measured."""
    import os
    import subprocess
    import sys

    code = (
        "import dataclasses, json, os, time\n"
        "from airstream.machine import calibration\n"
        "def measure(threads):\n"
        "    time.sleep(1.0)\n"
        "    return dataclasses.replace(calibration.NOMINAL, source=f'measured by {os.getpid()}')\n"
        "calibration._measure_in_child = measure\n"
        "print(json.dumps(dataclasses.asdict(calibration.machine_costs())))\n"
    )
    env = {**os.environ, "AIRSTREAM_CACHE_DIR": str(tmp_path)}
    env.pop("AIRSTREAM_COSTS", None)
    ranks = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    outputs = [
        json.loads(rank.communicate(timeout=300)[0].strip().splitlines()[-1]) for rank in ranks
    ]
    assert all(rank.returncode == 0 for rank in ranks)
    assert outputs[0]["source"].startswith("measured by ")
    assert outputs[0] == outputs[1] == outputs[2], "one process measured, the others read it"
    assert len(json.loads((tmp_path / "calibration.json").read_text())) == 1
