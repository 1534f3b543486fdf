"""The main stream's intra-op threads during a multi-stream CPU call: every thread the caller
has where no other stream works, ``threads_per_stream`` where one may (``runtime/cpu.py``
generates the calls; ``schedule/overlap.py`` says which ops may overlap another stream's work).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from airstream.machine.openmp import set_intra_op_threads
from airstream.runtime.call import Call
from airstream.schedule.overlap import overlapping_runs, uses_threads
from airstream.schedule.plan import StreamPlan, StreamSteps, Wait

__all__ = ["Switching", "Threads", "idle", "thread_plan", "wake", "working"]


def thread_plan(plan: StreamPlan) -> dict[torch.fx.Node, bool]:
    """For each main-stream op whose threads matter: True if it runs alone (every thread the
    caller has), False if another stream's work may overlap it (it asks at run time whether one
    is working: if none is, every thread; else ``threads_per_stream``)."""
    overlapping = overlapping_runs(plan)
    return {n: n not in overlapping for n in plan.stream(None).runs if uses_threads(n)}


class Threads:
    """The calling thread's intra-op threads (OpenMP's and MKL's) as the main stream goes:
    ``alone`` before a run of ops no other stream's work can overlap; ``now`` before each op
    another stream's work may overlap, by whether a side stream is working at that moment (a
    side stream is working from its start, or the return of one of its waits, to its next wait
    or its end). ``shared``: the count while another stream works."""

    def __init__(self, shared: int, mkl: Callable[[int], int] | None) -> None:
        self.shared = shared
        self.mkl = mkl

    def _use(self, state: Call, threads: int) -> None:
        if state.threads_now != threads:
            set_intra_op_threads(threads)
            if self.mkl is not None:
                self.mkl(threads)
            state.threads_now = threads

    def alone(self, state: Call) -> None:
        self._use(state, state.caller_threads)

    def now(self, state: Call) -> None:
        self._use(state, self.shared if any(state.working) else state.caller_threads)


def idle(state: Call, side: int) -> None:
    state.working[side] = False


def working(state: Call, side: int) -> None:
    state.working[side] = True


def wake(state: Call, sides: tuple[int, ...]) -> None:
    """The side streams about to be woken by a record are working from now: the recorder
    says so before they hold the GIL again to say it themselves, so the main stream's next
    op does not take their cores."""
    working = state.working
    for side in sides:
        working[side] = True


@dataclass(frozen=True)
class Switching:
    """What a call's generated code needs to switch the main stream's threads: the switcher,
    each big main-stream op's ``plan`` (True: runs alone) and, per event, the side streams that
    wait for it (``waiters``: a record marks them working before they wake)."""

    threads: Threads
    plan: Mapping[torch.fx.Node, bool]
    waiters: Mapping[int, tuple[int, ...]]

    @classmethod
    def of(
        cls,
        plan: StreamPlan,
        sides: Sequence[StreamSteps],
        shared: int,
        mkl: Callable[[int], int] | None,
    ) -> Switching | None:
        """The switching ``plan`` needs, or None where its main stream has no big op (then
        every stream keeps ``shared`` threads for the whole call)."""
        ops = thread_plan(plan) if sides else {}
        if not ops:
            return None
        waiters: dict[int, tuple[int, ...]] = {}
        for i, program in enumerate(sides):
            for step in program.steps:
                if isinstance(step, Wait):
                    waiters[step.event] = (*waiters.get(step.event, ()), i)
        return cls(Threads(shared, mkl), ops, waiters)
