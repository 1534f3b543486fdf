"""The CPU runtime's spinning handoff: the flag, its build and fallback, and both event kinds."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from tests.conftest import assert_same, slow

import airstream
from airstream.runtime import cpu, handoff

Flag = handoff.flag_type()
needs_flag = pytest.mark.skipif(
    not handoff.spins(), reason="the handoff extension could not be built"
)


@pytest.mark.parametrize(
    "kind",
    [pytest.param("spinning", marks=needs_flag), "lock"],
)
def test_a_flag_wakes_a_spinning_and_a_sleeping_waiter(kind: str) -> None:
    """Both kinds of flag, the extension's and the lock fallback, behave alike: a waiter passes
    once the flag is set, a set flag is set again without error, clear makes it wait again."""
    made = Flag if kind == "spinning" else handoff.LockFlag

    def wait(flag: object, spin_ns: int, woke: list[int]) -> None:
        flag.wait(spin_ns)  # type: ignore[attr-defined]
        woke.append(1)

    for spin_ns in (10**9, 0):  # spins the whole time / sleeps at once
        flag, woke = made(), []
        waiter = threading.Thread(target=wait, args=(flag, spin_ns, woke))
        waiter.start()
        time.sleep(0.05)
        assert not woke and not flag.is_set()
        flag.set()
        waiter.join(5)
        assert woke == [1] and flag.is_set()
        flag.wait(0)  # set: returns at once
        flag.set()  # set again: no error (a failed call sets every event)
        flag.clear()
        assert not flag.is_set()


@needs_flag
def test_wait_sets_then_after_letting_go_of_the_gil() -> None:
    ready, then = Flag(), Flag()
    ready.set()
    ready.wait(0, then)
    assert then.is_set()
    with pytest.raises(TypeError, match="then must be a Flag"):
        ready.wait(0, object())


def _sleeps(native_id: int) -> int:
    """How often thread ``native_id`` of this process went to sleep (Linux's count of its
    voluntary context switches)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text().splitlines()
    return int(next(ln for ln in status if ln.startswith("voluntary_ctxt_switches")).split()[1])


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="counts a thread's sleeps in /proc (Linux)"
)


@needs_flag
@needs_proc
def test_a_waiter_off_the_main_thread_sleeps_until_set() -> None:
    """An idle stream worker waits on its flag for as long as the process lives: it must not
    wake to take the GIL (it did every 20 ms to look for signals, which only the main thread
    handles), or it taxes every later call of any graph, the one measuring kept included."""
    flag, ids = Flag(), []

    def wait() -> None:
        ids.append(threading.get_native_id())
        flag.wait(0)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(0.05)
    before = _sleeps(ids[0])
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # the GIL busy, as a caller running torch work has it
        pass
    woke = _sleeps(ids[0]) - before
    flag.set()
    waiter.join(5)
    assert woke <= 2, f"an idle waiter woke {woke} times in 0.3 s"


@needs_flag
@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_reaches_the_main_thread_waiting_on_a_flag() -> None:
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    timer = threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        Flag().wait(0)  # never set
    timer.join()
    assert time.monotonic() - start < 1.0


def _forget() -> None:
    """Forget the loaded extension and team, so the next use looks at the environment again."""
    handoff._extension.cache_clear()
    handoff.team_runner.cache_clear()


def test_no_compiler_means_locks_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(handoff.sysconfig, "get_config_var", lambda name: "no-such-cc")
    _forget()
    try:
        with pytest.warns(RuntimeWarning, match="hand off with locks"):
            assert handoff.flag_type() is handoff.LockFlag and not handoff.spins()
    finally:
        _forget()


def test_locks_and_threads_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv("AIRSTREAM_HANDOFF", "locks")
        _forget()
        assert handoff.flag_type() is handoff.LockFlag and handoff.team_runner() is None
        monkeypatch.setenv("AIRSTREAM_HANDOFF", "threads")
        _forget()
        assert handoff.team_runner() is None
        assert handoff.flag_type() is Flag
    finally:
        monkeypatch.delenv("AIRSTREAM_HANDOFF")
        _forget()


class _Three(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("hand_a"):
            a = torch.relu(x) * 2
        with airstream.stream("hand_b"):
            b = x.cos() + 1
        return a + b + x.sin()


def _choose(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run side streams on the OpenMP team (``team``), on workers with flags (``flags``) or on
    workers with locks (``locks``); skip where this machine lacks the kind."""
    if kind != "locks" and not handoff.spins():
        pytest.skip("the handoff extension could not be built")
    if kind == "team" and cpu.team_runner() is None:
        pytest.skip("no OpenMP team here (torch is not on GNU OpenMP)")
    if kind != "team":
        monkeypatch.setattr(cpu, "team_runner", lambda: None)
    if kind == "locks":
        monkeypatch.setattr(cpu, "flag_type", lambda: handoff.LockFlag)


@pytest.mark.parametrize("kind", ["team", "flags", "locks"])
def test_every_handoff_runs_a_call_and_its_failure(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _choose(kind, monkeypatch)
    backend = airstream.get_backend()
    model = _Three()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(16, 16)
    for _ in range(20):
        assert_same(compiled(x), model(x))
    executor = backend.graphs[-1].executor
    assert isinstance(executor, cpu.CpuExecutor)
    sides = {str(stream.label): stream for _, stream in executor.sides}
    assert set(sides) == {"hand_a", "hand_b"}
    # each side stream's last record is left to its worker (after the GIL is free, with flags)
    assert all(stream.final_event is not None for stream in sides.values())
    assert executor.side_threads == ("openmp team" if kind == "team" else "workers")
    with airstream.profile() as prof:  # traced code keeps every record
        assert_same(compiled(x), model(x))
    assert {r.stream for r in prof.records} >= {"hand_a", "hand_b"}


class _TwoSleeps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.sin()
        with airstream.stream("handoff_slow"):
            a = torch.ops.airstream_test.sleep_then_copy(x, 1.0)
            c = torch.ops.airstream_test.sleep_then_copy(a + b, 1.0)  # after a wait for b
        return c + x


_CTRL_C = "tests/test_handoff.py::test_ctrl_c_reaches_a_caller_waiting_at_the_join"


@pytest.mark.parametrize(
    "kind",
    [
        "team",
        pytest.param("flags", marks=slow("a 2 s sleep on a side stream, interrupted", _CTRL_C)),
        pytest.param("locks", marks=slow("a 2 s sleep on a side stream, interrupted", _CTRL_C)),
    ],
)
@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_reaches_a_caller_waiting_at_the_join(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import probe_ops  # noqa: F401  (registers the test ops)

    _choose(kind, monkeypatch)
    model = _TwoSleeps()
    compiled = torch.compile(model, backend=airstream.get_backend())
    x = torch.rand(4)
    assert_same(compiled(x), model(x))  # compiles (and sleeps 2 s)
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        compiled(x)
    waited = time.monotonic() - start
    timer.join()
    # interrupted at 0.2 s: the call is failed, the side stream stops at its wait after its
    # first sleep (1 s) instead of running its second; an uninterruptible join would take 2 s
    assert waited < 1.7, f"the caller stayed blocked {waited:.2f} s"
    assert_same(compiled(x), model(x))


needs_team = pytest.mark.skipif(
    handoff.team_runner() is None, reason="no OpenMP team here (torch is not on GNU OpenMP)"
)


@needs_team
def test_run_team_runs_each_function_on_its_own_thread_at_once() -> None:
    run_team = handoff.team_runner()
    assert run_team is not None
    barrier = threading.Barrier(2, timeout=20)  # only concurrent calls get past it
    seen: dict[int, int] = {}

    def on(i: int, value: object) -> object:
        def fn() -> object:
            seen[i] = threading.get_ident()
            barrier.wait()
            return value

        return fn

    then = Flag()
    torch.add(torch.ones(1 << 16), 1)  # the caller's team exists, as after any torch work
    assert run_team((on(0, "result"), on(1, then))) == ("result",)
    assert seen[0] == threading.get_ident() and seen[1] != seen[0]
    assert then.is_set()  # a Flag a team function returns is set after it lets go of the GIL
    assert not barrier.broken


@needs_team
def test_run_team_raises_the_callers_error_and_declines_inside_a_parallel_region() -> None:
    run_team = handoff.team_runner()
    assert run_team is not None

    def fail() -> None:
        raise ValueError("from the caller's function")

    with pytest.raises(ValueError, match="caller's function"):
        run_team((fail, lambda: None))
    nested: list[object] = []
    # on a team thread, a second region could only run on one thread: nothing runs
    assert run_team((lambda: None, lambda: nested.append(run_team((lambda: 1, lambda: 2)))))
    assert nested == [None]


@needs_team
def test_a_call_needing_more_threads_than_the_callers_team_goes_to_workers() -> None:
    from tests import probe_ops

    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("hand_small_team"):
                a = torch.ops.airstream_test.probe(x.sin(), "side")
            return a + x.cos()

    model, x = Two(), torch.randn(8)
    compiled = torch.compile(model, backend=airstream.get_backend())
    assert_same(compiled(x), model(x))
    before = torch.get_num_threads()
    expected = model(x)
    torch.set_num_threads(1)  # a team of one: two streams need two threads
    try:
        probe_ops.SEEN.clear()
        assert_same(compiled(x), expected)
    finally:
        torch.set_num_threads(before)
    assert [thread for tag, thread, _ in probe_ops.SEEN] == ["airstream-stream-hand_small_team"]
    probe_ops.SEEN.clear()
