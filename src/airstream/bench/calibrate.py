"""The measurement behind ``airstream.machine.calibration``: what work and streams cost on this
machine.

Run in a child process by :func:`airstream.machine.calibration.machine_costs` (which caches the
result); it prints one JSON line, a :class:`~airstream.machine.calibration.MachineCosts`. Every
timing is a median of rounds taken in turn with the figure it is compared against (drift hits both
alike), each runner settled first so that it does not pay for the state the previous one left:

- dispatch: a small ``aten.add`` on 16 floats;
- bytes/s: an 8 x 2048 by 2048 x 2048 matrix product (weight-streaming, as in decode); the same
  product on one intra-op thread, MKL's included, over its time at the default threads
  (``thread_slowdown``);
  flops/s: 256 x 512 by 512 x 512;
- side stream and wait: a chain of small ops run by airstream's CPU runtime on one stream and with
  every other op on a side stream (2 and 10 hops: the difference per extra wait is the sync cost);
- overlap slowdowns, each by the runtime on one stream and on two: two 8 x 2048 by 2048 x 2048
  products (``overlap_slowdown``), two chains of small ops as long as one product
  (``host_slowdown``); a product beside small ops (``mixed_slowdown``) from the usable cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import torch

from airstream.machine import environment
from airstream.machine.calibration import MachineCosts, cache_path, machine_costs

__all__ = ["costs_lines", "costs_report", "main", "measure"]


def _medians(calls: int, rounds: int = 9, **runners: Any) -> list[float]:
    """Median seconds per call of each runner, timed in turn (drift hits them alike)."""
    from airstream.bench.timing import interleaved_medians

    medians = interleaved_medians(
        runners, rounds=rounds, calls_per_round=calls, warmup=3, settle=max(calls // 2, 2)
    )
    return [medians[name] for name in runners]


def _runner(fn: Any, example: list[torch.Tensor], side: Any) -> Any:
    """``fn`` traced, the calls ``side`` picks (calls -> some of them; None: single stream)
    placed on a side stream, planned and run by airstream's CPU runtime (no Dynamo, no
    compile)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from airstream.graph.streams import assign_streams
    from airstream.passes.toolkit import place_on_stream
    from airstream.runtime.cpu import CpuExecutor
    from airstream.runtime.serial import SerialExecutor
    from airstream.schedule.plan import build_plan

    gm = make_fx(fn)(*example)
    if side is not None:
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        place_on_stream(gm, side(calls), "calibration_side")
    plan = build_plan(gm, assign_streams(gm))
    executor = CpuExecutor(gm, plan, 1) if side is not None else SerialExecutor(gm, plan)
    return lambda: executor(list(example))


def _chain(hops: int) -> Any:
    def fn(x: torch.Tensor) -> torch.Tensor:
        for i in range(hops):
            x = x * 2 if i % 2 else x + 1
        return x

    return fn


def _pair(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> Any:
    return torch.mm(x, w1), torch.mm(x, w2)


def _chain_beside_chain(hops: int) -> Any:
    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        for _ in range(hops):
            a = a + 1
            b = b * 2
        return a, b

    return fn


def _muls(calls: list[Any]) -> list[Any]:
    return [n for n in calls if n.target is torch.ops.aten.mul.Tensor]


def _second_mm(calls: list[Any]) -> list[Any]:
    return [n for n in calls if n.target is torch.ops.aten.mm.default][1:]


def measure() -> MachineCosts:
    """Measure this process's figures now (about 2 s after import); see the module docstring."""
    generator = torch.Generator().manual_seed(0)
    small = torch.randn(16, generator=generator)
    add = torch.ops.aten.add.Tensor

    def adds() -> None:
        for _ in range(100):
            add(small, 1)

    (dispatch,) = _medians(5, adds=adds)
    dispatch /= 100
    x = torch.randn(8, 2048, generator=generator)
    w1 = torch.randn(2048, 2048, generator=generator)
    w2 = torch.randn(2048, 2048, generator=generator)
    default_threads = torch.get_num_threads()

    def gemv_one_thread() -> None:
        # On one thread, MKL's included: a side stream runs inside the caller's OpenMP team,
        # where MKL runs sequentially. (This process only measures: the process-wide setting is
        # what reaches MKL; the runtime's per-thread OpenMP setting would not.)
        torch.set_num_threads(1)
        try:
            torch.mm(x, w1)
        finally:
            torch.set_num_threads(default_threads)

    gemv, gemv1 = _medians(10, gemv=lambda: torch.mm(x, w1), gemv1=gemv_one_thread)
    moved = (x.numel() + w1.numel() + 8 * 2048) * 4
    a, b = torch.randn(256, 512, generator=generator), torch.randn(512, 512, generator=generator)
    (gemm,) = _medians(10, gemm=lambda: torch.mm(a, b))
    flops = 2 * 256 * 512 * 512

    x16 = [torch.randn(16, generator=generator)]
    one, one_side, many, many_side = _medians(
        100,
        rounds=15,
        one=_runner(_chain(2), x16, None),
        one_side=_runner(_chain(2), x16, _muls),
        many=_runner(_chain(10), x16, None),
        many_side=_runner(_chain(10), x16, _muls),
    )
    # 2 hops: one side op and 2 waits (there and back); 10 hops: 5 side ops and 10 waits
    handoff = max(one_side - one, 0.0)
    sync = max(((many_side - many) - handoff) / 8, 0.0)

    pair_inputs = [x, w1, w2]
    serial, parallel = _medians(
        4,
        rounds=25,
        serial=_runner(_pair, pair_inputs, None),
        parallel=_runner(_pair, pair_inputs, _second_mm),
    )
    slowdown = max(parallel - handoff, 1e-9) / max(serial / 2, 1e-9)

    # Small ops beside small ops: two chains of them, as long as one product. (A product beside
    # such a chain is not timed: the chain holds the GIL, and how long the product's thread then
    # waits to get it back, up to the 5 ms switch interval, varied from 1.02x to 1.79x between
    # runs on one VM. It is taken from the cores instead: beside work on another core, 1.0; on a
    # machine with one core the two share it, 2.0.)
    hops = max(int((serial / 2) / max(dispatch, 1e-7)), 10)
    host_inputs = [torch.randn(16, generator=generator), torch.randn(16, generator=generator)]
    chains_alone, chains = _medians(
        4,
        rounds=15,
        chains_alone=_runner(_chain_beside_chain(hops), host_inputs, None),
        chains=_runner(_chain_beside_chain(hops), host_inputs, _muls),
    )
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mixed_slowdown = 2.0 / max(usable or 1, 1)
    host_slowdown = (chains - handoff) / max(chains_alone / 2, 1e-9)
    return MachineCosts(
        dispatch_seconds=dispatch,
        bytes_per_second=moved / max(gemv - dispatch, 1e-9),
        flops_per_second=flops / max(gemm - dispatch, 1e-9),
        side_stream_seconds=handoff,
        sync_seconds=sync,
        overlap_slowdown=min(max(slowdown, 1.0), 2.0),
        mixed_slowdown=min(max(mixed_slowdown, 1.0), 2.0),
        host_slowdown=min(max(host_slowdown, 1.0), 2.0),
        source=f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        thread_slowdown=min(
            max((gemv1 - dispatch) / max(gemv - dispatch, 1e-9), 1.0), float(default_threads)
        ),
    )


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="airstream calibration")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps(dataclasses.asdict(measure())))
    return 0


def costs_report(recalibrate: bool = False) -> dict[str, Any]:
    """The figures auto_streams decides with here, for ``airstream doctor``."""
    mode = environment.AIRSTREAM_COSTS.read()
    costs = machine_costs(mode, recalibrate=recalibrate)
    return {
        **dataclasses.asdict(costs),
        "summary": costs.summary(),
        "mode": mode,
        "cache": str(cache_path()),
    }


def costs_lines(costs: dict[str, Any]) -> list[str]:
    """``airstream doctor``'s lines for :func:`costs_report`."""
    if not costs:
        return ["  not collected"]
    if costs["source"] == "nominal":
        origin = (
            "fixed nominal figures (AIRSTREAM_COSTS=nominal)"
            if costs["mode"] == "nominal"
            else "fixed nominal figures: measuring failed (see the warning above)"
        )
    else:
        origin = f"{costs['source']} on this machine, cached in {costs['cache']}"
    return [
        f"  {'figures':<18}{origin}",
        f"  {'side stream':<18}{costs['side_stream_seconds'] * 1e6:.0f} us per call (handoff "
        f"and join), {costs['sync_seconds'] * 1e6:.0f} us per further wait",
        f"  {'op':<18}{costs['dispatch_seconds'] * 1e6:.1f} us dispatch, "
        f"{costs['bytes_per_second'] / 1e9:.1f} GB/s, {costs['flops_per_second'] / 1e9:.0f} "
        "GFLOP/s at the default intra-op threads",
        f"  {'one thread':<18}a matrix multiply {costs.get('thread_slowdown', 1.0):.2f}x its time "
        "at the default threads (a stream runs one intra-op thread)",
        f"  {'overlap':<18}beside another stream's work, over the time alone (1.0: streams "
        "overlap fully; 2.0: no gain): a",
        f"  {'':<18}matrix multiply {costs['overlap_slowdown']:.2f}x beside a matrix multiply, "
        f"{costs['mixed_slowdown']:.2f}x beside small ops;",
        f"  {'':<18}small ops {costs['host_slowdown']:.2f}x beside small ops (they share the GIL)",
        f"  {'':<18}measure again: airstream doctor --recalibrate",
    ]
