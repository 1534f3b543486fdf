"""The OpenMP runtime's idle threads: found, released, and released by multi-stream CPU calls."""

from __future__ import annotations

import os
import re

import pytest
import torch
from tests.conftest import assert_same

import airstream
from airstream.errors import ConfigError
from airstream.machine import openmp

_OPENMP_BUILD = "OpenMP" in torch.__config__.parallel_info() and os.path.exists("/proc/self/maps")


def _thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _thread_ids_after_exit(before: set[str], timeout_s: float = 5.0) -> set[str]:
    """The thread ids once at least one of ``before`` has gone, or after ``timeout_s``. A thread
    libgomp releases leaves the pool's barrier and then exits on its own: on a busy machine
    (another xdist worker on the other core) it can still be listed for a while after the
    release returns."""
    import time

    deadline = time.monotonic() + timeout_s
    now = _thread_ids()
    while not before - now and time.monotonic() < deadline:
        time.sleep(0.001)
        now = _thread_ids()
    return now


def _parallel_op() -> None:
    """An op big enough that torch runs it on every intra-op thread (an OpenMP team)."""
    x = torch.ones(1 << 22)
    for _ in range(3):
        torch.add(x, x)


@pytest.mark.skipif(not _OPENMP_BUILD, reason="torch is not built with OpenMP here")
def test_the_runtime_torch_uses_is_found() -> None:
    found = openmp.openmp()
    assert found.runtime in ("GNU OpenMP", "Intel OpenMP", "LLVM OpenMP")
    assert found.library is not None and re.search(r"lib(g|i)?omp", found.library)
    assert found.can_release  # omp_pause_resource_all (OpenMP 5.0) is in every current runtime


@pytest.mark.skipif(
    not _OPENMP_BUILD or os.cpu_count() == 1 or openmp.openmp().runtime != "GNU OpenMP",
    reason="needs GNU OpenMP (it ends released threads; LLVM's put them to sleep) and 2 cores",
)
def test_release_ends_the_calling_threads_idle_team() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _parallel_op()
        with_team = _thread_ids()
        openmp.release_idle_threads()
        released = _thread_ids_after_exit(with_team)
        _parallel_op()  # the next parallel region starts the team again
        again = _thread_ids()
    finally:
        torch.set_num_threads(threads)
    # by thread id, not count: other threads of the process (a compile pool, another test's
    # workers) may start meanwhile
    assert len(with_team - released) == 1, (with_team, released)
    assert len(again - released) == 1, (released, again)


def _two_stream_model() -> tuple[torch.nn.Module, torch.Tensor]:
    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                a = torch.relu(x) * 2
            return a + x.sin()

    return Two(), torch.randn(8, 8)


@pytest.mark.parametrize(
    ("release", "spins_long", "team"),
    [(True, True, False), (False, True, False), (True, False, False), (True, True, True)],
)
def test_a_multi_stream_call_releases_idle_threads_where_they_spin_long(
    release: bool, spins_long: bool, team: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker threads need the cores the caller's spinning team holds; a call that runs its
    streams on that team (the default on GNU OpenMP) has nothing to release."""
    import dataclasses

    from airstream.runtime import cpu
    from airstream.runtime import select as backend_module  # chooses the executor

    if team and cpu.team_runner() is None:
        pytest.skip("no OpenMP team here (torch is not on GNU OpenMP, or no extension)")
    if not team:
        monkeypatch.setattr(cpu, "team_runner", lambda: None)
    calls: list[int] = []
    monkeypatch.setattr(cpu, "release_idle_threads", lambda: calls.append(1))
    policy = dataclasses.replace(openmp.openmp(), spins_long=spins_long)
    monkeypatch.setattr(backend_module, "openmp", lambda: policy)
    model, x = _two_stream_model()
    config = airstream.CompilerConfig()
    config.stream_config.release_openmp_threads = release
    backend = airstream.get_backend(config)
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        assert_same(compiled(x), model(x))
    plan = backend.graphs[-1].plan
    assert [str(s.label) for s in plan.streams if s.runs] == ["None", "side"]
    assert backend.graphs[-1].executor.side_threads == ("openmp team" if team else "workers")
    assert len(calls) == (3 if release and spins_long and not team else 0)


def test_a_single_stream_call_never_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    from airstream.runtime import cpu

    calls: list[int] = []
    monkeypatch.setattr(cpu, "release_idle_threads", lambda: calls.append(1))
    model = torch.nn.Linear(8, 8)
    compiled = torch.compile(model, backend=airstream.get_backend())
    x = torch.randn(2, 8)
    assert_same(compiled(x), model(x))
    assert calls == []  # nothing runs beside the caller: its team may keep spinning


def test_the_option_rejects_a_non_boolean() -> None:
    config = airstream.CompilerConfig()
    with pytest.raises(ConfigError, match="release_openmp_threads"):
        config.stream_config.release_openmp_threads = "yes"


@pytest.mark.parametrize(
    ("env", "words", "long"),
    [
        ({}, "spin 300,000 iterations, the default", True),
        ({"GOMP_SPINCOUNT": "10000"}, "spin 10,000 iterations, GOMP_SPINCOUNT=10000", False),
        ({"GOMP_SPINCOUNT": "2M"}, "spin 2,000,000 iterations", True),
        ({"GOMP_SPINCOUNT": "infinite"}, "spin without end", True),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "sleep at once", False),
        ({"OMP_WAIT_POLICY": "active"}, "spin without end, OMP_WAIT_POLICY=ACTIVE", True),
    ],
)
def test_the_gnu_policy_in_force(env: dict[str, str], words: str, long: bool) -> None:
    policy, spins_long = openmp._policy("GNU OpenMP", env)
    assert words in policy and spins_long is long


def test_the_llvm_policy_in_force() -> None:
    assert openmp._policy("LLVM OpenMP", {})[1] is True  # KMP_BLOCKTIME: 200 ms
    assert openmp._policy("Intel OpenMP", {"KMP_BLOCKTIME": "0"}) == (
        "idle threads spin 0 ms (KMP_BLOCKTIME)",
        False,
    )


@pytest.mark.skipif(
    not _OPENMP_BUILD or openmp.openmp().runtime != "GNU OpenMP", reason="needs GNU OpenMP"
)
def test_airstream_run_gets_a_short_spin_unless_a_policy_is_set() -> None:
    assert openmp.launch_environment({}) == {"GOMP_SPINCOUNT": openmp.LAUNCH_SPINCOUNT}
    assert openmp.launch_environment({"GOMP_SPINCOUNT": "300000"}) == {}
    assert openmp.launch_environment({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert openmp.installed_runtime() == "GNU OpenMP"  # found without importing torch
    assert openmp.launch_environment({}, "LLVM OpenMP") == {}


@pytest.mark.parametrize(
    ("argv", "is_run"),
    [
        (["python", "/venv/bin/airstream", "run", "--torchair", "s.py"], True),
        (["python", "-m", "airstream", "run", "s.py"], True),
        (["python", "-X", "importtime", "-u", "-m", "airstream.cli", "run", "s.py"], True),
        (["python", "/venv/bin/airstream", "doctor"], False),
        (["python", "-m", "airstream", "demo"], False),
        (["python", "-m", "pytest", "run"], False),
        (["python", "train.py", "run"], False),
        (["python", "-c", "import airstream"], False),
    ],
)
def test_the_run_command_is_recognised_before_torch_loads(argv: list[str], is_run: bool) -> None:
    from airstream.machine import launch

    assert launch.is_run_command(argv) is is_run
    assert launch.prepare(argv) == {}, "torch is loaded in this process: too late, nothing set"


_SPIN_SCRIPT = """
import os, time, torch
torch.set_num_threads(2)
x = torch.randn(256, 1024)
for _ in range(20):
    x.exp()
start = time.process_time()
for _ in range(100):  # after each parallel op the team's idle threads spin, burning CPU time
    x.exp()
    time.sleep(0.005)
print("spin", os.environ.get("GOMP_SPINCOUNT"), "cpu", time.process_time() - start)
"""


@pytest.mark.skipif(
    not _OPENMP_BUILD or openmp.openmp().runtime != "GNU OpenMP" or (os.cpu_count() or 1) < 2,
    reason="needs GNU OpenMP and 2 cores",
)
def test_airstream_run_starts_once_with_the_short_spin(tmp_path: os.PathLike[str]) -> None:
    """One process imports torch once, and its OpenMP runtime really runs with the short spin:
    the idle threads burn far less CPU time than in a plain `python` of the same script."""
    import subprocess
    import sys

    script = os.path.join(tmp_path, "spin.py")
    with open(script, "w") as f:
        f.write(_SPIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}

    def run(*command: str) -> tuple[float, str]:
        done = subprocess.run(
            [sys.executable, *command, script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        spin, cpu = re.search(r"spin (\S+) cpu ([\d.]+)", done.stdout).groups()  # type: ignore[union-attr]
        return float(cpu), f"{spin}\n{done.stderr}"

    plain, _ = run()
    started, report = run("-X", "importtime", "-m", "airstream", "run", "--torchair")
    assert report.startswith("10000\n")
    assert len(re.findall(r"\|\s+torch\n", report)) == 1, "torch was imported once"
    assert started < 0.6 * plain, f"idle spin CPU time {started:.3f} s vs {plain:.3f} s plain"
