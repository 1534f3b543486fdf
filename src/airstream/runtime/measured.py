"""A placement kept only where it measures faster: the streams the passes placed, and the same
graph on one stream, each compiled, timed in turn over a graph's first calls, the slower one
dropped (``stream_config.measure_placement``).

Calls alternate between the candidates two at a time (the placement first: a graph's first
call runs as placed, as it would unmeasured), and of each two only the second is timed, whole,
on the caller's clock: the first settles what the other candidate left (OpenMP threads still
spinning after its multi-threaded kernels, cold caches, a thread to start), which the candidate
would not find in its steady state, where its calls follow its own. Once each has ``calls``
timed calls, the placement is kept only if it wins by ``min_gain`` on the medians (one
stream's median over the placement's at least ``1 + min_gain``) and in at least two thirds of
the pairs of timed calls (a paired sign test: one spike on one side, a busy moment for the
machine, moves a median little and a pair count not at all, and drift in the machine's load
hits both calls of a pair alike). Otherwise one stream runs from then on. Every call returns
its candidate's result, so results never depend on the decision; the decision is final for the
graph.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airstream.runtime.codegen import Executor

__all__ = ["ONE_STREAM", "PLACED", "Measurement", "MeasuredExecutor"]

ONE_STREAM = "one stream"
PLACED = "streams as placed"
_PAIR_SHARE = 2 / 3  # the share of adjacent pairs the placement must win


@dataclass
class Measurement:
    """What a graph's first calls measured: each candidate's call times (seconds, in call
    order), and once decided, the candidate kept and why."""

    calls: int
    min_gain: float
    seconds: dict[str, list[float]] = field(default_factory=lambda: {ONE_STREAM: [], PLACED: []})
    chosen: str | None = None
    reason: str = ""

    def medians_ms(self) -> dict[str, float]:
        """Each candidate's median call time so far, in ms (measured calls only)."""
        return {k: 1e3 * statistics.median(v) for k, v in self.seconds.items() if v}

    def describe(self) -> str:
        """One line: the medians and the decision (or how far the measuring is)."""
        medians = ", ".join(f"{k} {v:.3f} ms" for k, v in self.medians_ms().items())
        if self.chosen is None:
            done = min(len(v) for v in self.seconds.values())
            return f"measuring ({done} of {self.calls} calls each): {medians}"
        return f"kept {self.chosen}: {self.reason} ({medians})"


def decide(measurement: Measurement) -> tuple[str, str]:
    """The candidate to keep and why, from ``calls`` timed calls of each."""
    one, placed = measurement.seconds[ONE_STREAM], measurement.seconds[PLACED]
    speedup = statistics.median(one) / statistics.median(placed)
    wins = sum(p < o for o, p in zip(one, placed, strict=False))
    pairs = min(len(one), len(placed))
    needed = 1 + measurement.min_gain
    words = f"{speedup:.2f}x of one stream, faster in {wins} of {pairs} pairs of calls"
    if speedup >= needed and wins >= _PAIR_SHARE * pairs:
        return PLACED, words
    return ONE_STREAM, f"{words} (needs {needed:.2f}x and {_PAIR_SHARE:.0%} of the pairs)"


class MeasuredExecutor:
    """Runs one stream and the placement in turn until :func:`decide` can choose, then the
    chosen one. Safe to call from several threads (a call measured under the lock counts)."""

    _boxed_call = True  # AOTAutograd hands it the argument list, which a candidate empties

    def __init__(
        self,
        one_stream: Executor,
        placed: Executor,
        measurement: Measurement,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.candidates = {ONE_STREAM: one_stream, PLACED: placed}
        self.measurement = measurement
        self._clock = clock
        self._lock = threading.Lock()
        self._chosen: Executor | None = None
        self._turn = 0

    @property
    def code(self) -> str:
        """The generated code of each candidate still kept."""
        return "\n".join(f"# {name}\n{run.code}" for name, run in self.candidates.items())

    def __call__(self, args: list[Any]) -> Any:
        chosen = self._chosen
        if chosen is not None:
            return chosen(args)
        with self._lock:
            if self._chosen is not None:
                return self._chosen(args)
            return self._measure(args)

    def _measure(self, args: list[Any]) -> Any:
        turn, self._turn = self._turn, self._turn + 1
        name = (PLACED, ONE_STREAM)[turn // 2 % 2]  # two calls each in turn: P P O O P P ...
        run = self.candidates[name]
        start = self._clock()
        result = run(args)
        elapsed = self._clock() - start
        if turn % 2 == 0:  # the first of its two: it settles what the other one left
            return result
        m = self.measurement
        m.seconds[name].append(elapsed)
        if all(len(v) >= m.calls for v in m.seconds.values()):
            m.chosen, m.reason = decide(m)
            self._chosen = self.candidates[m.chosen]
            self.candidates = {m.chosen: self._chosen}  # the other one's memory goes
        return result
