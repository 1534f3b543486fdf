"""A compiled two-stream model in real processes: run as ``python -m tests.process_cases CASE``.

tests/test_processes.py runs each case in a fresh interpreter with a time limit, so a hang fails
the test instead of CI. A case exits 0 when every process it starts computed what eager computes,
with the side stream really running beside the main one (the probes meet at a barrier that only
concurrent streams pass) on the thread the case expects. Cases:

- ``fork``: ``os.fork`` after the parent ran the model and a parallel torch op (so GNU OpenMP's
  pool holds threads the child will not have). The child calls with the parent's two intra-op
  threads (where torch's own parallel ops would hang: it compares with eager results the parent
  computed), then with one, as torch needs (DataLoader's workers set it); then the parent calls
  again.
- ``multiprocessing``: a ``fork`` pool's workers (one intra-op thread each, set by the pool's
  initializer) and a ``spawn`` process (which compiles anew).
- ``dataloader``: DataLoader workers (forked) whose dataset calls the compiled model.

Each process that would otherwise wait forever dumps its stacks and exits (an alarm).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import sys
import threading
from typing import Any

import torch
from tests import probe_ops

import airstream
from airstream.runtime.cpu import CpuExecutor

WATCHDOG_S = 90  # per process started: far above a call's milliseconds (none compiles)
CASE_WATCHDOG_S = 420  # the case's own process, which compiles (cold, on a busy VM: minutes)
probe = torch.ops.airstream_test.probe


class TwoStreams(torch.nn.Module):
    """A matmul and a probe on stream s1 beside another on the main stream."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            a = probe((x @ w).sin(), "side")
        b = probe((x @ w.t()).cos(), "main")
        return a + b


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(64, 64, generator=generator), torch.randn(64, 64, generator=generator)


def compiled(team: bool) -> tuple[Any, airstream.AirstreamBackend]:
    """The model compiled in the default mode, side streams on the caller's OpenMP team where
    ``team`` (the default) or on worker threads."""
    config = airstream.CompilerConfig()
    config.stream_config.openmp_team = team
    backend = airstream.get_backend(compiler_config=config)
    return torch.compile(TwoStreams(), backend=backend, fullgraph=True), backend


def side_threads(backend: airstream.AirstreamBackend) -> str:
    """Where every graph compiled through ``backend`` runs its side stream s1."""
    where = set()
    for graph in backend.graphs:  # one per intra-op thread count (Dynamo guards on it)
        executor = graph.executor
        assert isinstance(executor, CpuExecutor), type(executor)
        assert [s.label for s in graph.plan.side_streams] == ["s1"], graph.plan.side_streams
        where.add(executor.side_threads)
    (only,) = where
    return str(only)


def call(model: Any, where: str, expected: torch.Tensor | None = None) -> str:
    """Call ``model`` with its streams made to meet, check it against eager (``expected``, or
    computed now); the side stream's thread name. ``where``: the thread the side stream must run
    on (``"worker"``: airstream's worker for s1; ``"team"``: one of the caller's OpenMP team)."""
    x, w = inputs()
    barrier = threading.Barrier(2, timeout=WATCHDOG_S / 2)
    probe_ops.SEEN.clear()
    probe_ops.BARRIERS.update(side=barrier, main=barrier)
    try:
        got = model(x, w)
    finally:
        probe_ops.BARRIERS.clear()
    ran = {tag: thread for tag, thread, _ in probe_ops.SEEN}
    if expected is None:
        expected = TwoStreams()(x, w)  # after reading where the probes ran: eager runs them too
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert ran["main"] == threading.current_thread().name, ran
    if where == "worker":
        assert ran["side"] == "airstream-stream-s1", ran
    else:
        assert ran["side"] != ran["main"] and not ran["side"].startswith("airstream"), ran
    return ran["side"]


def _warm(models: dict[str, Any]) -> None:
    """Compile (the barrier would hold the fake-tensor trace too), at one intra-op thread as
    well (Dynamo guards on the thread count: a child that sets one would compile again), then
    leave GNU OpenMP's pool full of team threads, as any torch program's parallel ops do."""
    x, w = inputs()
    threads = torch.get_num_threads()
    for count in (1, threads):
        torch.set_num_threads(count)
        for model in models.values():
            model(x, w)
    big = torch.randn(1 << 22)
    for _ in range(3):
        big.mul(2).sin()


def _watchdog(seconds: int = WATCHDOG_S) -> None:
    """In ``seconds``, dump every thread's stack and end the process (an alarm, not
    faulthandler's timer thread, whose lock a forked child would wait on forever)."""
    faulthandler.register(signal.SIGALRM, all_threads=True, chain=True)  # then the default: exit
    signal.alarm(seconds)


def case_fork() -> None:
    (team, team_backend), (workers, workers_backend) = compiled(True), compiled(False)
    _warm({"team": team, "workers": workers})
    assert side_threads(workers_backend) == "workers"
    has_team = side_threads(team_backend) == "openmp team"
    if has_team:
        call(team, "team")
    call(workers, "worker")
    assert torch.get_num_threads() > 1, "the case needs more than one intra-op thread"
    expected = TwoStreams()(*inputs())
    compiled_before = (len(team_backend.graphs), len(workers_backend.graphs))
    pid = os.fork()
    if pid == 0:
        try:
            _watchdog()
            # the parent's intra-op threads: the calls run, as torch's own parallel ops cannot
            call(workers, "worker", expected)
            call(team, "worker", expected)  # no OpenMP team in a forked child: worker threads
            torch.set_num_threads(1)  # what torch needs here
            call(workers, "worker")
            call(team, "worker")
            compiled_now = (len(team_backend.graphs), len(workers_backend.graphs))
            assert compiled_now == compiled_before, "the child compiled again"
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked child failed ({status})"
    call(team, "team" if has_team else "worker")  # the parent keeps its team and workers
    call(workers, "worker")


def _in_pool_worker(where: str) -> str:
    _watchdog()
    return call(_MODELS[where], "worker")


def _spawned(queue: Any) -> None:
    _watchdog(CASE_WATCHDOG_S)  # it compiles
    model, backend = compiled(True)
    _warm({"team": model})
    where = "team" if side_threads(backend) == "openmp team" else "worker"
    queue.put(call(model, where))


_MODELS: dict[str, Any] = {}


def case_multiprocessing() -> None:
    (team, _), (workers, _) = compiled(True), compiled(False)
    _MODELS.update(team=team, workers=workers)
    _warm(_MODELS)
    fork = multiprocessing.get_context("fork")
    with fork.Pool(2, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        ran = pool.map_async(_in_pool_worker, ["team", "workers", "team", "workers"])
        assert ran.get(timeout=WATCHDOG_S) == ["airstream-stream-s1"] * 4
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    process = spawn.Process(target=_spawned, args=(queue,))
    process.start()
    side = queue.get(timeout=CASE_WATCHDOG_S)  # the spawned process imports torch and compiles
    process.join(timeout=WATCHDOG_S)
    assert process.exitcode == 0, f"the spawned process failed ({process.exitcode})"
    assert side, "the spawned process's side stream ran"


class _Calls(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        _watchdog()
        x, w = inputs()
        call(_MODELS["team"], "worker")
        return _MODELS["team"](x + index, w)


def case_dataloader() -> None:
    team, _ = compiled(True)
    _MODELS.update(team=team)
    _warm(_MODELS)
    loader = torch.utils.data.DataLoader(_Calls(), batch_size=None, num_workers=2, timeout=60)
    x, w = inputs()
    for index, got in enumerate(loader):
        torch.testing.assert_close(got, TwoStreams()(x + index, w), rtol=1e-5, atol=1e-5)


CASES = {"fork": case_fork, "multiprocessing": case_multiprocessing, "dataloader": case_dataloader}

if __name__ == "__main__":
    _watchdog(CASE_WATCHDOG_S)
    CASES[sys.argv[1]]()
    print(f"{sys.argv[1]}: ok")
