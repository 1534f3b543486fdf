"""Interleaved timing with medians: the only way timings are compared in airstream."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from airstream.runtime.cuda_graphs import capture_statuses

__all__ = [
    "paired_ratios",
    "MEASURING_CALLS",
    "checked_medians",
    "interleaved_medians",
    "run_conditions",
    "synchronized",
    "with_threads",
]


# Warm-up calls that let a runner whose placement is measured (stream_config.measure_placement:
# 8 timed calls of each candidate, each after an untimed one, by default) decide before the
# timing starts, so that the timing sees what it kept.
MEASURING_CALLS = 2 * 2 * 8


def interleaved_medians(
    candidates: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 15,
    calls_per_round: int = 200,
    warmup: int = 20,
    settle: int = 0,
) -> dict[str, float]:
    """Median seconds per call of each candidate, timed round-robin in one process.

    Each round times every candidate for ``calls_per_round`` calls, one after another, so drift
    in machine load hits all of them alike. ``settle`` untimed calls precede each candidate's
    timed calls in every round, so that it does not pay for the state the previous candidate
    left (OpenMP workers still spinning after a runner with more intra-op threads).
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            for _ in range(settle):
                fn()
            start = time.perf_counter()
            for _ in range(calls_per_round):
                fn()
            samples[name].append((time.perf_counter() - start) / calls_per_round)
    return {name: statistics.median(values) for name, values in samples.items()}


def with_threads(threads: int, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with ``threads`` intra-op threads on the calling thread."""

    def run() -> Any:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return fn()

    return run


def synchronized(device: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` followed by a device synchronize on a CUDA ``device`` (a timed call then ends when
    its kernels do); ``fn`` itself on CPU."""
    if not device.startswith("cuda"):
        return fn

    def run() -> Any:
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return run


def checked_medians(
    candidates: Mapping[str, Callable[[], Any]],
    want: Any,
    *,
    rounds: int,
    calls_per_round: int,
    rtol: float = 1e-4,
    atol: float = 1e-4,
    settle: int = 0,
) -> dict[str, float]:
    """Check every candidate's result against ``want``, then time them interleaved (no grad).

    torch's intra-op thread setting is restored afterwards, whatever the candidates set."""
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            for name, fn in candidates.items():
                torch.testing.assert_close(fn(), want, rtol=rtol, atol=atol, msg=name)
            return interleaved_medians(
                candidates,
                rounds=rounds,
                calls_per_round=calls_per_round,
                warmup=MEASURING_CALLS,
                settle=settle,
            )
    finally:
        torch.set_num_threads(threads)


def run_conditions(rounds: int, calls: int, device: str = "cpu") -> dict[str, Any]:
    """The fields every benchmark report carries: the machine, torch, and how it was timed."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cores": usable,  # the cores this process may run on (taskset, cgroups), not the machine's
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "rounds": rounds,
        "calls_per_round": calls,
    }


def cuda_graphs(backends: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per airstream runner, whether each of its graphs replays a CUDA graph (reduce-overhead:
    ``captured``, or ``not captured: <why>``); runners without CUDA graphs are left out."""
    found = {
        name: [s for g in getattr(b, "graphs", []) for s in capture_statuses(g.executor)]
        for name, b in backends.items()
    }
    return {name: statuses for name, statuses in found.items() if statuses}


def paired_ratios(per: Mapping[str, Sequence[float]], base: str) -> dict[str, float]:
    """Per runner, the median over rounds of ``base``'s time over the runner's in that round
    (the runners of a round ran one after another, so a drift of the machine hits both)."""
    return {
        n: statistics.median(b / t for b, t in zip(per[base], times, strict=True))
        for n, times in per.items()
    }
