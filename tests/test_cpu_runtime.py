"""CPU runtime: real concurrency, numerics against serial and eager, faults, threads, load."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from tests import probe_ops
from tests.conftest import assert_same, compile_model, graph_of, slow

import airstream
from airstream import torch_internals
from airstream.examples.guide import Model, custom_pre_pass
from airstream.runtime.cpu import CpuExecutor
from airstream.runtime.workers import worker_count

probe = torch.ops.airstream_test.probe
fail_if_negative = torch.ops.airstream_test.fail_if_negative


class _Parallel(torch.nn.Module):
    """Two probes that must meet at a barrier: only concurrent execution gets past it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            a = probe(x.sin(), "side")
        b = probe(x.cos(), "main")
        return a + b


@pytest.fixture
def probes() -> Any:
    probe_ops.SEEN.clear()
    probe_ops.BARRIERS.clear()
    yield probe_ops
    probe_ops.SEEN.clear()
    probe_ops.BARRIERS.clear()


@pytest.mark.parametrize("where", ["openmp team", "workers"])
def test_side_stream_runs_concurrently_beside_the_caller(probes: Any, where: str) -> None:
    from airstream.runtime import cpu

    if where == "openmp team" and cpu.team_runner() is None:
        pytest.skip("no OpenMP team here (torch is not on GNU OpenMP, or no extension)")
    config = airstream.CompilerConfig()
    config.stream_config.openmp_team = where == "openmp team"  # the default: True
    compiled, backend = compile_model(_Parallel(), config, fullgraph=True)
    x = torch.randn(8)
    compiled(x)  # compile first; the barrier would hold the fake-tensor trace too
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CpuExecutor) and executor.side_threads == where
    barrier = threading.Barrier(2, timeout=20)
    probes.BARRIERS.update(side=barrier, main=barrier)
    probes.SEEN.clear()
    assert_same(compiled(x), x.sin() + x.cos())
    where_ran = {tag: thread for tag, thread, _ in probes.SEEN}
    assert where_ran["main"] == threading.current_thread().name
    if where == "workers":
        assert where_ran["side"] == "airstream-stream-s1"
    else:  # a thread of the caller's OpenMP team, not one of airstream's workers
        assert where_ran["side"] != where_ran["main"]
        assert not where_ran["side"].startswith("airstream-stream")
    assert not barrier.broken


def test_threads_per_stream_is_set_inside_the_worker(probes: Any) -> None:
    config = airstream.CompilerConfig()
    config.stream_config.threads_per_stream = 2
    compiled, _ = compile_model(_Parallel(), config)
    x = torch.randn(4)
    compiled(x)
    probes.SEEN.clear()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compiled(x)
        assert torch.get_num_threads() == 1, "the caller's setting is restored after the call"
    finally:
        torch.set_num_threads(before)
    threads = {tag: n for tag, _, n in probes.SEEN}
    assert threads == {"side": 2, "main": 2}, "every stream, the caller's too, uses 2 threads"


def _models() -> list[tuple[str, Any, airstream.CompilerConfig, tuple[torch.Tensor, ...]]]:
    guide = airstream.CompilerConfig()
    guide.post_grad_custom_pre_pass = custom_pre_pass
    return [
        ("guide", Model(), guide, (torch.randn(16, 16),)),
        ("branches", _Branches(), airstream.CompilerConfig(), (torch.randn(8, 32),)),
        ("mutation", _MutateInput(), airstream.CompilerConfig(), (torch.randn(64),)),
        ("random", _Random(), airstream.CompilerConfig(), (torch.randn(64),)),
    ]


class _Branches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, expert in enumerate(self.experts):
            with airstream.stream(f"e{i % 2}"):
                outs.append(torch.relu(expert(x)))
        return torch.stack(outs).sum(0)


class _MutateInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            a = x.sin() * 2  # reads x on s1
        x.mul_(3)  # writes x on main, after the read
        return a + x


class _Random(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            a = torch.rand_like(x) + x
        b = torch.randn_like(x)
        with airstream.stream("s2"):
            c = torch.rand_like(x)
        return a * b + c


@pytest.mark.parametrize("name", ["guide", "branches", "mutation", "random"])
def test_many_calls_equal_serial_and_eager(name: str) -> None:
    _, model, config, inputs = next(m for m in _models() if m[0] == name)
    serial_config = config.copy()
    serial_config.debug.run_eagerly = True
    compiled, backend = compile_model(model, config)
    serial, _ = compile_model(model, serial_config)
    with torch.no_grad():
        for i in range(200):
            xs = [t.clone() for t in inputs]
            xs_serial = [t.clone() for t in inputs]
            xs_eager = [t.clone() for t in inputs]
            seed = 1000 + i
            torch.manual_seed(seed)
            got = compiled(*xs)
            torch.manual_seed(seed)
            ref = serial(*xs_serial)
            torch.manual_seed(seed)
            want = model(*xs_eager)
            assert_same(got, ref)
            assert_same(got, want)
            assert_same(xs, xs_eager)  # input mutations too
    assert isinstance(graph_of(backend, "inference").executor, CpuExecutor)


class _Faulty(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            a = fail_if_negative(x)
        b = fail_if_negative(y)
        return a + b


@pytest.mark.parametrize(("bad", "where"), [("x", "stream 's1'"), ("y", "the main stream")])
def test_op_error_reaches_caller_with_type_node_and_stream(bad: str, where: str) -> None:
    compiled, backend = compile_model(_Faulty())
    good = torch.rand(4)
    assert_same(compiled(good, good), good + good)
    assert isinstance(graph_of(backend, "inference").executor, CpuExecutor)
    x, y = (-good, good) if bad == "x" else (good, -good)
    with pytest.raises(ValueError, match="negative input") as info:
        compiled(x, y)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "fail_if_negative" in notes and where in notes, notes
    for _ in range(3):  # nothing stays blocked; the next calls work
        assert_same(compiled(good, good), good + good)


@pytest.mark.torch_api  # its behaviour differs between torch releases
def test_concurrent_callers_get_correct_results() -> None:
    model = _Branches()
    inputs = [torch.randn(8, 32, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    compiled_model, backend = compile_model(model)
    with torch.no_grad():
        compiled_model(inputs[0])
    errors: list[BaseException] = []
    intra_op = torch.get_num_threads()
    seen: list[int] = []

    def worker(i: int) -> None:
        try:
            seen.append(torch.get_num_threads())  # started while others are inside calls
            with torch.no_grad():
                for _ in range(50):
                    assert_same(compiled_model(inputs[i]), expected[i], rtol=1e-6, atol=1e-6)
            seen.append(torch.get_num_threads())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors, errors[0]
    # a stream's intra-op threads are set on its own thread only: a caller started while
    # another is inside a call keeps the process's count (torch 2.11 also guards on it, and
    # recompiled in every such thread)
    assert seen == [intra_op] * 16
    if torch_internals.torch_release()[:2] >= (2, 13):  # 2.11's Dynamo: see test_load.py
        assert len(backend.graphs) == 1, "no recompile in the callers' threads"


@slow(
    "many graphs compiled",
    "tests/test_load.py::test_two_hundred_graphs_add_no_threads_beyond_the_registry",
)
def _airstreams_threads() -> set[str]:
    """The threads airstream may have started or given a Python state: its workers, OpenMP team
    threads (``Dummy-N`` until named), not other libraries' (tqdm's monitor, Inductor's pool)."""
    return {
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("airstream-", "openmp-team-", "Dummy-"))
    }


def test_many_graphs_do_not_grow_threads() -> None:
    workers_before = worker_count()
    threads_before = _airstreams_threads()
    for i in range(20):
        torch.compiler.reset()
        model = _Branches()  # stream labels e0 and e1, in every graph
        compiled, _ = compile_model(model)
        x = torch.randn(2 + i, 32)
        with torch.no_grad():
            assert_same(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    # At most the two workers e0 and e1 are new (none if an earlier test made them).
    assert worker_count() - workers_before <= 2
    assert len(_airstreams_threads() - threads_before) <= 2


def _two_stream_chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    torch.ops.air.scope_enter(["_user_stream_label"], ["side"])
    a = torch.mm(x, w).relu()  # reads x on the side stream
    torch.ops.air.scope_exit()
    b = torch.mm(x, w).sigmoid()  # and on main
    return a + b  # a crosses from side to main


@pytest.mark.parametrize("kind", ["serial", "cpu"])
def test_a_call_empties_its_arguments_and_keeps_no_value(kind: str) -> None:
    """The boxed convention: the executor empties the argument list, and once the call returns
    nothing it made or was given stays alive (no input, no cross-stream slot, no worker job)."""
    import weakref

    from torch.fx.experimental.proxy_tensor import make_fx

    from airstream.graph.streams import assign_streams
    from airstream.runtime.serial import SerialExecutor
    from airstream.schedule.plan import build_plan

    w = torch.randn(8, 8)
    gm = make_fx(_two_stream_chain, tracing_mode="fake")(torch.randn(4, 8), w)
    plan = build_plan(gm, assign_streams(gm))
    executor = SerialExecutor(gm, plan) if kind == "serial" else CpuExecutor(gm, plan, 1)
    for _ in range(2):  # the second call also checks nothing of the first one lingers
        x = torch.randn(4, 8)
        want = _two_stream_chain(x, w)
        x_ref = weakref.ref(x)
        args = [x, w]
        del x
        got = executor(args)
        assert args == []
        assert x_ref() is None, "the input outlived the call"
        assert_same(got, want)


def test_worker_streams_give_mkl_their_thread_count_and_the_caller_gets_its_own_back() -> None:
    """Outside an OpenMP team, OpenMP's per-thread count does not reach MKL's matrix multiplies:
    each worker stream and the calling thread set MKL's own per-thread count for the call, and
    the caller's is restored after it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from airstream.graph.streams import assign_streams
    from airstream.schedule.plan import build_plan

    w = torch.randn(8, 8)
    gm = make_fx(_two_stream_chain, tracing_mode="fake")(torch.randn(4, 8), w)
    executor = CpuExecutor(gm, build_plan(gm, assign_streams(gm)), 1, openmp_team=False)
    real = executor._mkl
    assert real is not None
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()

    def recording(threads: int) -> int:
        with lock:
            calls.append((threading.current_thread().name, threads))
        return real(threads)

    executor._mkl = recording
    before = real(0)
    real(before)
    x = torch.randn(4, 8)
    assert_same(executor([x, w]), _two_stream_chain(x, w))
    caller = threading.current_thread().name
    mine = [t for name, t in calls if name == caller]
    workers = [t for name, t in calls if name != caller]
    assert mine == [1, before], "the caller runs the call on one thread, then gets its own back"
    assert workers == [1], "the side stream's worker runs its products on one thread"
    assert real(before) == before  # the caller's MKL setting is as it was


class _Window(torch.nn.Module):
    """A big op before the fork and one after the join (alone); two on each stream between."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = probe(x, "before")
        with airstream.stream("s1"):
            s = probe(probe(a.sin(), "side"), "side2")
        m = probe(probe(a.cos(), "first"), "beside")
        return probe(s + m, "after")


def test_the_main_stream_gets_every_thread_back_where_no_other_stream_works() -> None:
    """Before the fork and after the join the main stream's ops run on the caller's threads
    (schedule/overlap.py); between them, on one thread while the side stream works."""
    compiled, backend = compile_model(_Window(), airstream.CompilerConfig())
    x = torch.randn(256, 256)  # big enough for intra-op threads to matter
    compiled(x)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CpuExecutor) and executor.side_threads == "workers"
    alone = {n.name: a for n, a in executor.thread_plan.items() if n.name.startswith("probe")}
    assert alone == {"probe": True, "probe_3": False, "probe_4": False, "probe_5": True}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        probe_ops.SEEN.clear()
        # side meets first, then side2 meets beside: the side stream works (inside its ops,
        # between two barriers) when the main stream asks before beside
        probe_ops.BARRIERS.update(
            side=(one := threading.Barrier(2, timeout=20)),
            first=one,
            side2=(two := threading.Barrier(2, timeout=20)),
            beside=two,
        )
        assert_same(compiled(x), x.sin() + x.cos())
        assert torch.get_num_threads() == 2, "the caller's setting is restored after the call"
    finally:
        torch.set_num_threads(before)
        probe_ops.BARRIERS.clear()
    threads = {tag: n for tag, _, n in probe_ops.SEEN}
    # first: the fork's record marked the side stream working before it woke
    assert threads == {"before": 2, "side": 1, "side2": 1, "first": 1, "beside": 1, "after": 2}
    # Small tensors: no op's threads matter, nothing to switch, the OpenMP team runs the call
    torch.compiler.reset()  # static shapes again (a second shape would make them symbolic)
    small, backend = compile_model(_Window(), airstream.CompilerConfig())
    small(torch.randn(8))
    assert graph_of(backend, "inference").executor.thread_plan == {}


def test_an_op_beside_a_side_stream_takes_every_thread_when_none_works() -> None:
    from airstream.runtime.call import Call
    from airstream.runtime.handoff import LockFlag
    from airstream.runtime.threads import Threads

    state = Call(LockFlag, events=0, sides=2, slots=0)
    state.start(caller_threads=2)
    used: list[int] = []
    threads = Threads(1, used.append)  # records MKL's count as it is set
    before = torch.get_num_threads()
    try:
        threads.now(state)  # both side streams start out working
        state.working[0] = False
        threads.now(state)  # one still works
        state.working[1] = False
        threads.now(state)  # none works: every thread
        threads.alone(state)  # already there: nothing to set
        assert used == [1, 2] and state.threads_now == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("team", [True, False], ids=["openmp team", "workers"])
def test_a_calls_events_state_and_slots_are_made_once_and_reused(team: bool) -> None:
    """A call takes its context from the executor's free list and gives it back, whatever the
    handoff (flags or locks); one that fails drops it (a side stream may still set its last
    event); concurrent calls never share one."""

    class _Checked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("s1"):
                a = fail_if_negative(x.sin())
            return a + x.cos()

    config = airstream.CompilerConfig()
    config.stream_config.openmp_team = team
    compiled, backend = compile_model(_Checked(), config)
    x = torch.rand(8) + 1  # sin(x) > 0
    compiled(x)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CpuExecutor)
    (objects,) = executor._free
    for _ in range(3):
        assert_same(compiled(x), x.sin() + x.cos())
        assert executor._free == [objects]  # the same ones, every call
    with pytest.raises(ValueError, match="negative"):
        compiled(-x)  # in (-2, -1): its sin is negative
    assert executor._free == []  # dropped with the failed call
    assert_same(compiled(x), x.sin() + x.cos())
    assert len(executor._free) == 1 and executor._free[0] is not objects
    results: list[bool] = []

    def call() -> None:
        for _ in range(50):
            results.append(torch.allclose(compiled(x), x.sin() + x.cos()))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 200 and 1 <= len(executor._free) <= 4


@pytest.mark.parametrize("traced", [False, True])
def test_a_record_after_another_stream_failed_the_call_is_no_second_failure(traced: bool) -> None:
    """With the lock handoff, a call that fails sets (releases) every event; a stream still
    running then records one of them: that is no error of its own."""
    from airstream.runtime import events
    from airstream.runtime.call import Aborted, Call
    from airstream.runtime.handoff import LockFlag
    from airstream.runtime.trace import CallTrace

    call = Call(LockFlag, events=2, sides=1, slots=0)  # locks
    call.start(caller_threads=1)
    call.fail(ValueError("the side stream's op"), "node 'x' on stream s1")
    if traced:
        events.record_traced(call.events, 0, CallTrace().stream("s1"))
    else:
        events.record(call.events, 0)  # raised "release unlocked lock" before
    with pytest.raises(Aborted):  # its next wait sees the failed call
        events.wait(call.events, 1, call)
    assert isinstance(call.error, ValueError) and call.where == "node 'x' on stream s1"
