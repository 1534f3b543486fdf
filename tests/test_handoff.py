"""The CPU runtime's spinning handoff: the flag, its build and fallback, and both event kinds."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from tests.conftest import assert_same

import airstream
from airstream.runtime import cpu, handoff

Flag = handoff.flag_type()
needs_flag = pytest.mark.skipif(Flag is None, reason="the handoff extension could not be built")


@needs_flag
def test_a_flag_wakes_a_spinning_and_a_sleeping_waiter() -> None:
    def wait(flag: object, spin_ns: int, woke: list[int]) -> None:
        flag.wait(spin_ns)  # type: ignore[attr-defined]
        woke.append(1)

    for spin_ns in (10**9, 0):  # spins the whole time / sleeps at once
        flag, woke = Flag(), []
        waiter = threading.Thread(target=wait, args=(flag, spin_ns, woke))
        waiter.start()
        time.sleep(0.05)
        assert not woke and not flag.is_set()
        flag.set()
        waiter.join(5)
        assert woke == [1] and flag.is_set()
        flag.wait(0)  # set: returns at once
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


def test_no_compiler_means_locks_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(handoff.sysconfig, "get_config_var", lambda name: "no-such-cc")
    handoff.flag_type.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="hand off with locks"):
            assert handoff.flag_type() is None
    finally:
        handoff.flag_type.cache_clear()


def test_locks_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRSTREAM_HANDOFF", "locks")
    handoff.flag_type.cache_clear()
    try:
        assert handoff.flag_type() is None
    finally:
        handoff.flag_type.cache_clear()


class _Three(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("hand_a"):
            a = torch.relu(x) * 2
        with airstream.stream("hand_b"):
            b = x.cos() + 1
        return a + b + x.sin()


@pytest.mark.parametrize("kind", ["flags", "locks"])
def test_both_event_kinds_run_a_call_and_its_failure(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "flags" and Flag is None:
        pytest.skip("the handoff extension could not be built")
    if kind == "locks":
        monkeypatch.setattr(cpu, "flag_type", lambda: None)
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
    # with flags, each side stream's last record is left to its worker (after the GIL is free)
    finals = [stream.final_event for stream in sides.values()]
    assert all(f is not None for f in finals) if kind == "flags" else finals == [None, None]
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


@pytest.mark.parametrize("kind", ["flags", "locks"])
@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_ctrl_c_reaches_a_caller_waiting_at_the_join(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import probe_ops  # noqa: F401  (registers the test ops)

    if kind == "flags" and Flag is None:
        pytest.skip("the handoff extension could not be built")
    if kind == "locks":
        monkeypatch.setattr(cpu, "flag_type", lambda: None)
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
