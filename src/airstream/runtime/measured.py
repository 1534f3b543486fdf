"""A placement kept only where it measures faster: the streams the passes placed, and the same
graph on one stream, each compiled, timed in turn over a graph's first calls, the slower one
dropped (``stream_config.measure_placement``); with a dynamic size, one decision per size range.

Calls go round the candidates two at a time (the placements first: a graph's first call runs as
placed, as it would unmeasured), and of each two only the second is timed, whole, on the
caller's clock: the first settles what the other candidate left (OpenMP threads still spinning
after its multi-threaded kernels, cold caches, a thread to start), which the candidate would not
find in its steady state, where its calls follow its own. Once each has ``calls`` timed calls, a
placement is kept only if it wins by ``min_gain`` on the medians (one stream's median over the
placement's at least ``1 + min_gain``) and in at least two thirds of the pairs of timed calls
(the i-th timed call of each: a paired sign test: one spike on one side, a busy moment for the
machine, moves a median little and a pair count not at all, and drift in the machine's load hits
both calls of a pair alike); of the placements that pass, taken simplest first (the candidates'
order: fewest syncs first), one more complex is kept only where its median beats the simpler
one's by ``min_gain`` too. Otherwise one stream runs from then on. Every call returns its
candidate's result, so results never depend on the decision.

A graph compiled with a dynamic size (``s0`` tokens) has a decision per size range
(:mod:`airstream.runtime.size_ranges`: decode and prefill differ), chosen at each call by the
sizes of its arguments and measured on the first calls of each range; decisions already taken
(``known``: stored by an earlier process) are not measured again, and each new one is handed to
``on_decided`` (which stores it). A static graph has one range, ``all sizes``, and drops the
candidates it did not keep.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airstream.runtime.codegen import Executor

__all__ = [
    "ALL_SIZES",
    "ONE_STREAM",
    "PLACED",
    "MeasuredExecutor",
    "Measurement",
    "Measurements",
    "decide",
]

ONE_STREAM = "one stream"
PLACED = "streams as placed"
ALL_SIZES = "all sizes"
_PAIR_SHARE = 2 / 3  # the share of pairs a placement must win


def _two() -> dict[str, list[float]]:
    return {ONE_STREAM: [], PLACED: []}


@dataclass
class Measurement:
    """What one size range's first calls measured: each candidate's timed calls (seconds, in
    call order; one stream is the baseline), and once decided, the candidate kept and why."""

    calls: int
    min_gain: float
    seconds: dict[str, list[float]] = field(default_factory=_two)
    chosen: str | None = None
    reason: str = ""
    size_range: str = ALL_SIZES
    stored: bool = False  # decided by an earlier process and read from disk

    def medians_ms(self) -> dict[str, float]:
        """Each candidate's median call time so far, in ms (measured calls only)."""
        return {k: 1e3 * statistics.median(v) for k, v in self.seconds.items() if v}

    def describe(self) -> str:
        """One line: the medians and the decision (or how far the measuring is)."""
        medians = ", ".join(f"{k} {v:.3f} ms" for k, v in self.medians_ms().items())
        where = "" if self.size_range == ALL_SIZES else f"{self.size_range}: "
        if self.chosen is None:
            done = min(len(v) for v in self.seconds.values())
            return f"{where}measuring ({done} of {self.calls} calls each): {medians}"
        stored = " (stored)" if self.stored else ""
        return f"{where}kept {self.chosen}{stored}: {self.reason} ({medians})"

    def as_dict(self) -> dict[str, Any]:
        """The JSON form a decision is stored in."""
        return {
            "calls": self.calls,
            "min_gain": self.min_gain,
            "seconds": self.seconds,
            "chosen": self.chosen,
            "reason": self.reason,
            "size_range": self.size_range,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """A stored decision read back (:meth:`as_dict`'s form)."""
        return cls(
            int(data["calls"]),
            float(data["min_gain"]),
            {str(k): [float(s) for s in v] for k, v in data["seconds"].items()},
            str(data["chosen"]),
            str(data["reason"]),
            str(data["size_range"]),
            stored=True,
        )


@dataclass
class Measurements:
    """A graph's measurements, one per size range in order of first use; ``sizes``: what the
    ranges range over (``""``: a static graph, one range)."""

    sizes: str
    ranges: dict[str, Measurement] = field(default_factory=dict)
    latest: str | None = None  # the range of the latest call that was measured or new

    @property
    def current(self) -> Measurement | None:
        """The measurement of the latest range called (None before the first call)."""
        return None if self.latest is None else self.ranges[self.latest]

    @property
    def decided(self) -> bool:
        """Whether every range called so far has decided (and at least one was called)."""
        return bool(self.ranges) and all(m.chosen is not None for m in self.ranges.values())

    def describe(self) -> str:
        """One line per range called (or stored), each as :meth:`Measurement.describe`."""
        if not self.ranges:
            over = f" of each range of {self.sizes}" if self.sizes else ""
            return f"not measured yet: the first calls{over} measure"
        return "\n".join(m.describe() for m in self.ranges.values())


def decide(measurement: Measurement) -> tuple[str, str]:
    """The candidate to keep and why, from ``calls`` timed calls of each. The candidates are
    taken simplest first (one stream, then in the order given: fewest syncs first), and one is
    kept only where it passes against one stream (``min_gain`` on the medians and two thirds of
    the pairs) and its median also beats the simpler one kept so far by ``min_gain``: a
    placement that is not measurably faster than a simpler one is noise, not a gain."""
    seconds = measurement.seconds
    one = seconds[ONE_STREAM]
    needed = 1 + measurement.min_gain
    words: list[str] = []
    best, best_median = ONE_STREAM, statistics.median(one)
    for name, times in seconds.items():
        if name == ONE_STREAM:
            continue
        median = statistics.median(times)
        speedup = statistics.median(one) / median
        wins = sum(p < o for o, p in zip(one, times, strict=False))
        pairs = min(len(one), len(times))
        text = f"{speedup:.2f}x of one stream, faster in {wins} of {pairs} pairs of calls"
        words.append(text if len(seconds) == 2 else f"{name} {text}")
        passes = speedup >= needed and wins >= _PAIR_SHARE * pairs
        if passes and best_median / median >= needed:
            best, best_median = name, median
    said = "; ".join(words)
    if best != ONE_STREAM:
        return best, said
    return ONE_STREAM, f"{said} (needs {needed:.2f}x and {_PAIR_SHARE:.0%} of the pairs)"


@dataclass
class _Range:
    measurement: Measurement
    order: tuple[str, ...]  # the turn order: placements first, one stream last
    turn: int = 0
    chosen: Executor | None = None


class MeasuredExecutor:
    """Runs the candidates in turn, per size range, until :func:`decide` can choose, then the
    chosen one. ``candidates``: name -> executor, one of them :data:`ONE_STREAM`; ``sizes``: the
    range of a call's arguments (None: a static graph); ``agree``: called with a measurement
    before it decides (processes that must decide alike replace its times by their sum). Safe to
    call from several threads (a call measured under the lock counts). ``one_stream_first``:
    one stream takes each range's first turn (the order must not change the decision: a
    candidate's calls may leave no state behind that slows another, see
    :mod:`airstream.graph.foreign_ops`)."""

    def __init__(
        self,
        candidates: Mapping[str, Executor],
        calls: int,
        min_gain: float,
        *,
        sizes: Callable[[list[Any]], str] | None = None,
        described_sizes: str = "",
        known: Mapping[str, Measurement] | None = None,
        on_decided: Callable[[Measurement], None] | None = None,
        agree: Callable[[Measurement], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        one_stream_first: bool = False,
    ) -> None:
        if ONE_STREAM not in candidates or len(candidates) < 2:
            raise ValueError(
                f"measuring needs {ONE_STREAM!r} and a placement, got {list(candidates)}"
            )
        self.candidates = dict(candidates)
        # AOTAutograd hands it the argument list, which a candidate empties; an instance
        # attribute, so a functools.wraps around it (a backward's) keeps it (see serial.py)
        self._boxed_call = True
        self.measurements = Measurements(described_sizes)
        self._calls, self._min_gain = calls, min_gain
        self._sizes = sizes
        # stored decisions of candidates this graph has (what explain and the report show)
        self._known = {k: m for k, m in (known or {}).items() if m.chosen in self.candidates}
        self.measurements.ranges.update(self._known)
        self._on_decided = on_decided
        self._agree = agree
        self._clock = clock
        self._one_stream_first = one_stream_first
        self._lock = threading.Lock()
        self._ranges: dict[str, _Range] = {}

    @property
    def measurement(self) -> Measurement | None:
        """The latest range's measurement (:attr:`Measurements.current`)."""
        return self.measurements.current

    @property
    def code(self) -> str:
        """The generated code of each candidate still kept."""
        return "\n".join(f"# {name}\n{run.code}" for name, run in self.candidates.items())

    def __call__(self, args: list[Any]) -> Any:
        key = ALL_SIZES if self._sizes is None else self._sizes(args)
        state = self._ranges.get(key)
        if state is not None and state.chosen is not None:
            return state.chosen(args)
        with self._lock:
            state = self._ranges.get(key)
            if state is None:
                state = self._ranges[key] = self._start(key)
            self.measurements.latest = key
            if state.chosen is not None:
                return state.chosen(args)
            return self._measure(state, args)

    def _start(self, key: str) -> _Range:
        """A range's state: its stored decision, or a new measurement."""
        stored = self._known.get(key)
        if stored is not None and stored.chosen is not None:
            chosen = self.candidates[stored.chosen]
            if self._sizes is None:  # one range only: the others' memory goes
                self.candidates = {stored.chosen: chosen}
            return _Range(stored, (), chosen=chosen)
        names = [n for n in self.candidates if n != ONE_STREAM]
        seconds: dict[str, list[float]] = {ONE_STREAM: [], **{n: [] for n in names}}
        measurement = Measurement(self._calls, self._min_gain, seconds, size_range=key)
        self.measurements.ranges[key] = measurement
        # the placement's turn first: a graph's first call runs as placed, as unmeasured
        turns = sorted(names, key=lambda n: n != PLACED)
        if self._one_stream_first:  # the order must not matter (tests/test_measured_state.py)
            return _Range(measurement, (ONE_STREAM, *turns))
        return _Range(measurement, (*turns, ONE_STREAM))

    def _measure(self, state: _Range, args: list[Any]) -> Any:
        turn, state.turn = state.turn, state.turn + 1
        name = state.order[turn // 2 % len(state.order)]  # two calls each: P P O O P P ...
        start = self._clock()
        result = self.candidates[name](args)
        elapsed = self._clock() - start
        if turn % 2 == 0:  # the first of its two: it settles what the other one left
            return result
        m = state.measurement
        m.seconds[name].append(elapsed)
        if all(len(v) >= m.calls for v in m.seconds.values()):
            if self._agree is not None:  # the processes that must decide alike pool their times
                self._agree(m)
            m.chosen, m.reason = decide(m)
            state.chosen = self.candidates[m.chosen]
            if self._sizes is None:  # one range only: the others' memory goes
                self.candidates = {m.chosen: state.chosen}
            if self._on_decided is not None:
                self._on_decided(m)
        return result
