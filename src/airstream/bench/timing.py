"""Interleaved timing with medians: the only way timings are compared in airstream."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

__all__ = ["interleaved_medians"]


def interleaved_medians(
    candidates: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 15,
    calls_per_round: int = 200,
    warmup: int = 20,
) -> dict[str, float]:
    """Median seconds per call of each candidate, timed round-robin in one process.

    Each round times every candidate for ``calls_per_round`` calls, one after another, so drift
    in machine load hits all of them alike.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            for _ in range(calls_per_round):
                fn()
            samples[name].append((time.perf_counter() - start) / calls_per_round)
    return {name: statistics.median(values) for name, values in samples.items()}
