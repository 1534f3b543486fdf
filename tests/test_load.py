"""Faults and load: concurrent failures, 8 x 500 calls, many graphs, 10,000 calls without
memory growth, interrupted callers."""

from __future__ import annotations

import _thread
import gc
import random
import threading
import tracemalloc
from typing import Any

import pytest
import torch
from tests import probe_ops
from tests.conftest import assert_same, compile_model, slow
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream import torch_internals
from airstream.graph.streams import assign_streams
from airstream.runtime.cpu import CpuExecutor
from airstream.runtime.workers import worker_count
from airstream.schedule.plan import build_plan

ops = torch.ops.airstream_test
assert probe_ops.SEEN is not None  # registers the test ops


class _TwoFaultable(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with airstream.stream("load_side"):
            a = ops.fail_if_negative(x).sin()
        b = ops.fail_if_negative(y).cos()
        return a + b


def _run_threads(target: Any, n: int, timeout: float = 120) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    return errors


# torch 2.11's Dynamo recompiles a function called from several threads at once now and then
# (a BACKEND_MATCH guard failure, pytorch/pytorch#168373), and a call made while another thread
# compiles fails there ("Detected that you are using FX to symbolically trace a
# dynamo-optimized function"): docs/torch-versions.md.
_DYNAMO_THREAD_SAFE = torch_internals.torch_release()[:2] >= (2, 13)


@pytest.mark.torch_api  # its behaviour differs between torch releases
@pytest.mark.skipif(
    not _DYNAMO_THREAD_SAFE, reason="torch 2.11's Dynamo recompiles concurrent callers"
)
def test_faults_on_both_streams_under_concurrency() -> None:
    compiled, _ = compile_model(_TwoFaultable())
    good = torch.rand(16)
    # both graphs the callers need (Dynamo guards on `x is y`), compiled before the threads
    # start: on torch 2.11 a call while another thread compiles fails inside Dynamo
    compiled(good, good)
    compiled(good, good.clone())

    def caller(i: int) -> None:
        rng = random.Random(i)
        for _ in range(60):
            where = rng.choice(["none", "side", "main", "both"])
            x = -good if where in ("side", "both") else good
            y = -good if where in ("main", "both") else good
            if where == "none":
                assert_same(compiled(x, y), x.sin() + y.cos())
            else:
                with pytest.raises(ValueError, match="negative input"):
                    compiled(x, y)

    assert not _run_threads(caller, 8)
    assert_same(compiled(good, good), good.sin() + good.cos())


class _Mlp2(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("load_a"):
            left = self.a(x).relu()
        return left * self.b(x).sigmoid()


@slow(
    "8 threads x 500 calls",
    "tests/test_cpu_runtime.py::test_concurrent_callers_get_correct_results",
)
def test_eight_threads_times_500_calls() -> None:
    model = _Mlp2()
    compiled, _ = compile_model(model)
    inputs = [torch.randn(4, 16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        compiled(inputs[0])

    def caller(i: int) -> None:
        with torch.no_grad():
            for _ in range(500):
                assert_same(compiled(inputs[i]), expected[i], rtol=1e-6, atol=1e-6)

    errors = _run_threads(caller, 8, timeout=300)
    assert not errors, errors[0]


def _graph(i: int) -> tuple[torch.fx.GraphModule, Any]:
    label = f"many_{i % 3}"

    def f(x: torch.Tensor) -> torch.Tensor:
        torch.ops.air.scope_enter(["_user_stream_label"], [label])
        a = (x * (i + 1)).sin()
        torch.ops.air.scope_exit()
        return a + x.cos()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(8))
    return gm, f


def test_two_hundred_graphs_add_no_threads_beyond_the_registry() -> None:
    workers_before, threads_before = worker_count(), threading.active_count()
    x = torch.randn(8)
    for i in range(200):
        gm, f = _graph(i)
        executor = CpuExecutor(gm, build_plan(gm, assign_streams(gm)), 1)
        assert_same(executor([x]), f(x))
    new_workers = worker_count() - workers_before
    assert new_workers <= 3, "one worker per label: many_0, many_1, many_2"
    assert threading.active_count() - threads_before <= new_workers


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize(
    "calls",
    [
        1_000,
        pytest.param(
            10_000,
            marks=slow(
                "10,000 calls under tracemalloc",
                "tests/test_load.py::test_ten_thousand_calls_without_memory_growth",
            ),
        ),
    ],
)
def test_ten_thousand_calls_without_memory_growth(calls: int) -> None:
    compiled, _ = compile_model(_Mlp2())
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(500):  # warm up caches and allocators
            compiled(x)
        gc.collect()
        rss_before = _rss_bytes()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(calls):
            compiled(x)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        rss_after = _rss_bytes()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    print(f"{calls:,} calls: Python heap {growth:+d} B, RSS {rss_after - rss_before:+d} B")
    limit = max(256 * 1024 * calls // 10_000, 64 * 1024)  # ~26 bytes per call, 64 KB at least
    assert growth < limit, f"Python heap grew by {growth} bytes over {calls:,} calls"
    assert rss_after - rss_before < 32 * 1024 * 1024, "RSS grew by more than 32 MiB"


class _SlowSide(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("load_slow"):
            a = ops.sleep_then_copy(x, 0.5)
        return a + x


@pytest.mark.usefixtures("sigint_raises")
def test_interrupting_a_blocked_caller_leaves_no_worker_blocked() -> None:
    compiled, _ = compile_model(_SlowSide())
    x = torch.rand(4)
    compiled(x)  # compile (sleeps once)
    timer = threading.Timer(0.1, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        compiled(x)  # the caller is blocked at the join when the interrupt arrives
    timer.join()
    assert_same(compiled(x), x + x)  # the worker is free again


class _InterruptMain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("load_wait"):
            a = x.sin()
        b = ops.interrupt_if_negative(x)
        with airstream.stream("load_wait"):
            c = a * b  # the side stream waits for the main stream here
        return c


def test_keyboard_interrupt_from_an_op_on_main_while_a_side_stream_waits() -> None:
    compiled, _ = compile_model(_InterruptMain())
    good = torch.rand(4)
    assert_same(compiled(good), good.sin() * good)
    with pytest.raises(KeyboardInterrupt):
        compiled(-good)
    assert_same(compiled(good), good.sin() * good)


class _FaultAt(torch.nn.Module):
    """A two-stream program whose op at ``where`` raises for a negative input: ``main_first``
    (the main stream's first op, before the side stream starts its work), ``side_mid`` (a side
    op between two others, its result recorded for main), ``side_while_main_waits`` (a side op
    that raises late, while main is blocked waiting for it)."""

    def __init__(self, where: str, interrupt: bool) -> None:
        super().__init__()
        self.where = where
        self.fault = ops.interrupt_if_negative if interrupt else ops.fail_if_negative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.where == "main_first":
            a = self.fault(x)
            with airstream.stream("load_fault"):
                b = x.cos()
            return a + b
        with airstream.stream("load_fault"):
            b = x.cos()
            if self.where == "side_while_main_waits":
                b = ops.sleep_then_copy(b, 0.001)
            b = self.fault(x) * b
            b = b.exp()
        return x.sin() + b  # main waits for the side stream's b


@pytest.mark.parametrize(
    "calls",
    [
        50,
        pytest.param(
            1_000,
            marks=slow(
                "2 x 1,000 failed calls under tracemalloc (about 30 s each)",
                "tests/test_load.py::test_a_thousand_failed_calls_leave_no_thread_or_memory_behind",
            ),
        ),
    ],
)
@pytest.mark.parametrize("interrupt", [False, True], ids=["ValueError", "KeyboardInterrupt"])
@pytest.mark.parametrize("where", ["main_first", "side_mid", "side_while_main_waits"])
def test_a_thousand_failed_calls_leave_no_thread_or_memory_behind(
    where: str, interrupt: bool, calls: int
) -> None:
    model = _FaultAt(where, interrupt)
    compiled, backend = compile_model(model)
    good = torch.rand(8)
    assert_same(compiled(good), model(good))
    (graph,) = backend.graphs
    assert graph.streams.nodes_on("load_fault")
    kind = KeyboardInterrupt if interrupt else ValueError
    op = "interrupt_if_negative" if interrupt else "fail_if_negative"
    stream = "main" if where == "main_first" else "load_fault"
    with pytest.raises(kind) as raised:
        compiled(-good)
    note = "\n".join(getattr(raised.value, "__notes__", []))
    assert op in note and stream in note, note  # the error names the op and its stream
    threads = threading.active_count()
    tracemalloc.start()
    # Python's and torch's own caches fill over the first few hundred failed calls (to about
    # 90 KB here, with or without airstream's streams): the growth that counts is the second
    # window's, once they are full
    for _ in range(calls):
        with pytest.raises(kind):
            compiled(-good)
    gc.collect()
    before = tracemalloc.take_snapshot()
    for _ in range(calls):
        with pytest.raises(kind):
            compiled(-good)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert threading.active_count() == threads, "a failed call left a thread behind"
    assert growth < 64 * 1024, f"Python heap grew by {growth} bytes over {calls:,} failed calls"
    assert_same(compiled(good), model(good))  # and the next call works
