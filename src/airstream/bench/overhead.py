"""Per-op overhead of single-stream airstream against ``fx.GraphModule`` and ``fx.Interpreter``.

The model is a chain of ``ops`` small adds, so op dispatch dominates. Four ways to run the same
aten graph are timed interleaved (medians):

- ``fx.GraphModule``: FX-generated Python code (the baseline),
- ``fx.Interpreter``: node-by-node interpretation (what airstream avoids),
- ``airstream executor``: airstream's serial executor called directly,
- ``airstream torch.compile``: the whole compiled call (Dynamo guards, AOTAutograd wrapper),
- ``aot_eager torch.compile``: PyTorch's own AOTAutograd backend, for the fixed per-call cost that
  any AOTAutograd backend pays,
- ``airstream cache_compile``: the same compile through the on-disk compile cache
  (:func:`airstream.cache_compile`: its guards are checked by airstream, not by Dynamo).

It also measures what one side stream costs a call (handoff, events, join), at the process's
intra-op threads: a two-op graph with one op on a side stream, on the caller's OpenMP team (the
default where it can) and on a worker thread, against the same graph on one stream, and next to
it the floor for this machine: the same two ops with a hand-written handoff (a queue to a
waiting thread and a lock back), no compiler involved.
"""

from __future__ import annotations

import _thread
import queue
import tempfile
import threading
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from airstream.backend import get_backend
from airstream.bench.timing import interleaved_medians, run_conditions
from airstream.caching.compile_cache import cache_compile
from airstream.options.config import CompilerConfig
from airstream.runtime.handoff import describe as describe_handoff

__all__ = ["run_overhead"]


def _aten_config() -> CompilerConfig:
    """What this benchmark measures: the executor's own cost per op and per handoff, on aten
    calls (mode reduce-overhead; the CPU default, max-autotune, would fuse the chain into one
    Inductor kernel)."""
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    return config


def _chain(ops: int) -> Any:
    def f(x: torch.Tensor) -> torch.Tensor:
        for _ in range(ops):
            x = x + 1
        return x

    return f


def run_overhead(ops: int = 200, rounds: int = 15, calls: int = 100) -> dict[str, Any]:
    """Time the runners on a chain of ``ops`` adds; return per-op figures and ratios. The side
    stream's cost is measured at the process's intra-op threads, as a model runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = _measure(ops, rounds, calls)
    finally:
        torch.set_num_threads(threads)
    report["side_stream"] = _side_stream_cost(rounds, calls)
    return report


def _measure(ops: int, rounds: int, calls: int) -> dict[str, Any]:
    fn = _chain(ops)
    x = torch.randn(16)
    gm = make_fx(fn)(x)
    interpreter = torch.fx.Interpreter(gm)
    backend = get_backend(_aten_config())
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    compiled(x)
    aot_eager = torch.compile(fn, backend="aot_eager", dynamic=False)
    executor = backend.graphs[-1].executor
    with tempfile.TemporaryDirectory(prefix="airstream-overhead-") as cache_dir:
        cached = cache_compile(fn, config=_aten_config(), cache_dir=cache_dir)
        cached(x)
    expected = fn(x)
    for runner in (gm(x), executor([x])[0], compiled(x), aot_eager(x), cached(x)):
        torch.testing.assert_close(runner, expected)
    medians = interleaved_medians(
        {
            "fx.GraphModule": lambda: gm(x),
            "fx.Interpreter": lambda: interpreter.run(x),
            "airstream executor": lambda: executor([x]),
            "airstream torch.compile": lambda: compiled(x),
            "aot_eager torch.compile": lambda: aot_eager(x),
            "airstream cache_compile": lambda: cached(x),
        },
        rounds=rounds,
        calls_per_round=calls,
    )
    base = medians["fx.GraphModule"]
    return {
        # The per-call "is anyone profiling?" check, timed on its own: an unprofiled call pays it
        # once, so an op pays at most this (a one-op graph), and this / ops in the chain.
        "us_profiler_check_per_call": _profiler_check_cost(),
        "benchmark": "overhead",
        "ops": ops,
        **run_conditions(rounds, calls),
        "results": {
            name: {
                "us_per_call": t * 1e6,
                "us_per_op": t * 1e6 / ops,
                "ratio_vs_graphmodule": t / base,
            }
            for name, t in medians.items()
        },
    }


def _profiler_check_cost(repeat: int = 200_000) -> float:
    """Median microseconds of one ``tracing_wanted()`` call over 5 timed loops."""
    import statistics
    import time

    from airstream.runtime.trace import tracing_wanted

    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            tracing_wanted()
        samples.append((time.perf_counter() - start) / repeat * 1e6)
    return statistics.median(samples)


def _side_stream_cost(rounds: int, calls: int) -> dict[str, Any]:
    """One side stream against one stream: the default runtime (the caller's OpenMP team where
    it can) and worker threads (``stream_config.openmp_team = False``), beside the floor of a
    hand-written thread handoff."""
    from airstream.ops.stream import stream

    def two_ops(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with stream("bench_side"):
            a = x + 1
        return a, x * 2

    def one_stream(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * 2

    x = torch.randn(16)
    workers_config = _aten_config()
    workers_config.stream_config.openmp_team = False
    side = torch.compile(two_ops, backend=get_backend(_aten_config()), dynamic=False)
    workers = torch.compile(two_ops, backend=get_backend(workers_config), dynamic=False)
    main = torch.compile(one_stream, backend=get_backend(_aten_config()), dynamic=False)
    torch.testing.assert_close(side(x), main(x))
    torch.testing.assert_close(workers(x), main(x))
    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def worker() -> None:
        torch.set_num_threads(1)
        while True:
            job = jobs.get()
            if job is None:
                return
            job()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    add, mul = torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor

    def by_hand() -> tuple[torch.Tensor, torch.Tensor]:
        out: list[torch.Tensor] = []
        done = _thread.allocate_lock()
        done.acquire()

        def job() -> None:
            out.append(add(x, 1))
            done.release()

        jobs.put(job)
        doubled = mul(x, 2)
        done.acquire()
        return out[0], doubled

    try:
        medians = interleaved_medians(
            {
                "side": lambda: side(x),
                "workers": lambda: workers(x),
                "main": lambda: main(x),
                "by_hand": by_hand,
            },
            rounds=rounds,
            calls_per_round=calls * 10,
        )
    finally:
        jobs.put(None)
        thread.join()
    return {
        "side_threads": describe_handoff(),
        "intra_op_threads": float(torch.get_num_threads()),
        "us_per_call_one_side_stream": medians["side"] * 1e6,
        "us_per_call_one_side_stream_workers": medians["workers"] * 1e6,
        "us_per_call_single_stream": medians["main"] * 1e6,
        "us_side_stream_cost": (medians["side"] - medians["main"]) * 1e6,
        "us_side_stream_cost_workers": (medians["workers"] - medians["main"]) * 1e6,
        "us_hand_written_handoff_call": medians["by_hand"] * 1e6,
    }


def format_overhead(report: dict[str, Any]) -> str:
    """The report as a table."""
    lines = [
        f"per-op overhead: chain of {report['ops']} adds on 16 floats, 1 intra-op thread, "
        f"{report['rounds']} interleaved rounds x {report['calls_per_round']} calls, medians "
        f"({report['cores']} cores, torch {report['torch']})",
        f"{'runner':<26}{'us/call':>10}{'us/op':>8}{'vs GraphModule':>16}",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"{name:<26}{r['us_per_call']:>10.1f}{r['us_per_op']:>8.2f}"
            f"{r['ratio_vs_graphmodule']:>15.2f}x"
        )
    check = report["us_profiler_check_per_call"]
    lines.append(
        f"with no profiler active, tracing costs one check per call: {check:.3f} us, so at most "
        f"{check:.3f} us per op (a one-op graph), {check / report['ops']:.4f} us per op here"
    )
    side = report["side_stream"]
    lines.append(
        f"one side stream ({side['intra_op_threads']:.0f} intra-op threads; side streams run "
        f"{side['side_threads']}): {side['us_per_call_one_side_stream']:.1f} us/call vs "
        f"{side['us_per_call_single_stream']:.1f} us/call on one stream: "
        f"{side['us_side_stream_cost']:.1f} us per call for the handoff and join\n"
        f"on worker threads (stream_config.openmp_team = False): "
        f"{side['us_per_call_one_side_stream_workers']:.1f} us/call, "
        f"{side['us_side_stream_cost_workers']:.1f} us per call\n"
        f"floor on this machine: the same two ops with a hand-written thread handoff take "
        f"{side['us_hand_written_handoff_call']:.1f} us/call (no compiler, no Dynamo guards)"
    )
    return "\n".join(lines)
