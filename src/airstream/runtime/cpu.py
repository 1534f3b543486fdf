"""CPU runtime: the main stream on the calling thread, each side stream on its worker thread.

Every stream runs with ``stream_config.threads_per_stream`` intra-op threads, the calling thread
included for the duration of the call (its own setting is restored afterwards): OpenMP's
per-thread count and, on worker threads, MKL's (which OpenMP's does not reach outside a
parallel region; inside the caller's OpenMP team MKL runs on one thread by itself). The main
stream's big ops get every thread the caller had wherever no other stream works: those no
other stream's work can overlap (``schedule/overlap.py``: before the first fork, between a join
and the next fork, after the last join) by one switch per run of them in its generated code, and
those another stream's work may overlap by asking, before each, whether a side stream is working
at that moment (``runtime/threads.py``). A graph whose main stream has big ops runs its side
streams on worker threads; the caller's OpenMP team (below) serves the others, since inside the team
every op runs on one thread.

Every stream's steps become one generated function (``runtime/stream_code.py``): a record sets a
per-call event, a wait waits for it. Events are flags (``runtime/handoff.py``: a waiter spins
briefly without the GIL, then sleeps, where the extension is built; else a lock with the same
interface). A side stream's last record (the one the caller's join waits for) is set by its
worker after it lets go of the GIL, so the caller resumes without waiting for the GIL.

The caller hands each stream the inputs it reads and empties its own argument list; a value one
stream makes and another reads goes through a per-call slot of its own for every (value, reading
stream) pair, which the reader empties when it first reads it: nothing the call computes
outlives its last use on any stream. A call costs one handoff per side stream, not one per op.
A call's context (``runtime/call.py``: events, slots, failure, threads) is made once and reset
for every later call: no thread of a call touches it after the call returns (the join, or a
wait for a side stream's done flag where no join covers its last step, saw to that). A failed
call's is dropped.

Each side stream runs under the caller's thread-local torch state, captured once per call
(``runtime/thread_state.py``: grad and inference mode, autocast, torch function and dispatch
modes, saved-tensor hooks, the profiler). A call made from inside a stream of a call in flight
on the same thread (a Python op calling a compiled function) runs every stream of its graph on
that thread, in plan order: its side streams' workers may be busy with the outer call, waiting
for this one.

Failure handling: an op that raises on any stream marks the call failed and sets every event of
the call, so no stream stays blocked; streams that wake up to a failed call stop at their next
wait. The caller waits until every side stream of the call has finished, then gets the original
exception, with a note naming the node and the stream. The next call starts clean.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from airstream.machine.openmp import release_idle_threads, set_intra_op_threads
from airstream.runtime.call import Aborted, Call
from airstream.runtime.codegen import GeneratedCode
from airstream.runtime.handoff import SPIN_NS, flag_type, team_runner
from airstream.runtime.serial import SerialExecutor
from airstream.runtime.slots import Handover
from airstream.runtime.stream_code import StreamCode
from airstream.runtime.thread_state import CallerState, carrier, run_as_caller
from airstream.runtime.threads import Switching
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.runtime.workers import Job, StreamWorker, submit_all, worker_for
from airstream.schedule.plan import StreamPlan
from airstream.torch_internals import mkl_thread_setter, require

__all__ = ["CpuExecutor"]


def _name_team_thread() -> None:
    """Give the OpenMP team thread running a side stream a name traces can show (Python calls a
    thread it did not start ``Dummy-N``)."""
    thread = threading.current_thread()
    if thread.name.startswith("Dummy-"):
        thread.name = f"openmp-team-{thread.native_id}"


# Whether this thread is running a stream of a call (its main stream, or a side stream's job):
# per thread, so the hot path reads no shared state.
_inside = threading.local()


class CpuExecutor:
    """Boxed callable running a StreamPlan: side streams on the caller's OpenMP team where it
    can, else one worker thread per side stream."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        plan: StreamPlan,
        threads_per_stream: int,
        *,
        release_openmp_threads: bool = True,
        openmp_team: bool = True,
    ) -> None:
        self._boxed_call = True  # instance attribute: survives functools.wraps (see serial.py)
        self.plan = plan
        self.threads_per_stream = threads_per_stream
        self.release_openmp_threads = release_openmp_threads
        self._flag = flag_type()
        handover = Handover(gm, plan)
        self._num_slots = len(handover.slot)
        self._num_events = max((s.event for s in plan.syncs), default=-1) + 1
        sides = [s for s in plan.side_streams if s.runs]
        self._mkl = None  # MKL's own per-thread count, for the worker-thread path
        if sides:
            require("cpu-streams")
            self._mkl = mkl_thread_setter()
        # The main stream's ops get the caller's threads back where no other stream works.
        switching = Switching.of(plan, sides, threads_per_stream, self._mkl)
        self.thread_plan = dict(switching.plan) if switching is not None else {}
        self.main = StreamCode(gm, plan.stream(None), handover, True, switching)
        self.sides: tuple[tuple[StreamWorker, StreamCode], ...] = tuple(
            (worker_for(str(s.label)), StreamCode(gm, s, handover, False, switching, i))
            for i, s in enumerate(sides)
        )
        # One thread per stream on the caller's OpenMP team, where streams run one intra-op
        # thread each (inside a parallel region every torch op runs on its one thread) and the
        # main stream has no step to run alone on more.
        wanted = openmp_team and threads_per_stream == 1 and switching is None and self.sides
        self._team = team_runner() if wanted else None
        # Side streams run under the caller's thread-local state (runtime/thread_state.py).
        self._carrier = carrier() if self.sides else None
        # The side streams whose last step no join waits for: the caller waits for their end.
        self._unjoined = tuple(i for i, (_, s) in enumerate(self.sides) if s.final_event is None)
        # Each call's context, reused by later calls; one per concurrent call: a caller takes
        # one, and gives it back (list.pop and append are atomic).
        self._free: list[Call] = []
        self._gm = gm
        self._serial: SerialExecutor | None = None

    @property
    def code(self) -> str:
        """The generated code of every stream."""
        parts = [f"# stream main\n{self.main.code.module.code.strip()}"]
        parts += [f"# stream {s.label}\n{s.code.module.code.strip()}" for _, s in self.sides]
        return "\n\n".join(parts)

    @property
    def side_threads(self) -> str:
        """Where side streams run: ``"openmp team"`` (the caller's OpenMP team, where a call can
        form one) or ``"workers"`` (a worker thread per stream)."""
        return "openmp team" if self._team is not None else "workers"

    def _nested(self) -> SerialExecutor:
        """This graph on one thread, for a call made from inside another call's stream."""
        if self._serial is None:
            self._serial = SerialExecutor(self._gm, self.plan)
        return self._serial

    def _take(self, caller_threads: int) -> Call:
        """A free call context, started, or a new one."""
        try:
            call = self._free.pop()
        except IndexError:
            call = Call(self._flag, self._num_events, len(self.sides), self._num_slots)
        call.start(caller_threads)
        return call

    def __call__(self, args: list[Any]) -> Any:
        if getattr(_inside, "call", False):
            # Called from an op of a call in flight on this thread (a Python op calling a
            # compiled function): its side streams could queue behind a job of the outer call
            # waiting for this thread, so this call runs every stream here, in plan order.
            return self._nested()(args)
        trace, main = None, self.main.code
        if tracing_wanted():
            main = self.main.traced.get()
            for _, stream in self.sides:
                stream.traced.get()  # built now, not inside the call's time
            trace = CallTrace()  # its clock starts once the traced code exists
        caller_threads = torch.get_num_threads()
        call = self._take(caller_threads)
        caller = CallerState.capture(self._carrier)
        inputs = [stream.pick(args) for _, stream in self.sides]
        main_inputs = self.main.pick(args)
        args.clear()  # the boxed convention: every input now lives only where it is read

        def jobs(threads: int | None) -> list[Job]:
            return [
                self._side_job(i, inputs[i], call, caller, trace, threads)
                for i in range(len(self.sides))
            ]

        run_main = self._main_job(main, main_inputs, call, trace)
        ran = None
        # A team no larger than the one the caller's own torch ops use: a larger one would
        # leave OpenMP managing more threads than it has cores, which throttles its spinning
        # for every later parallel op of the process.
        if self._team is not None and caller_threads > len(self.sides):
            ran = self._team((run_main, *jobs(None)))
        if ran is not None:
            result = ran[0]
        else:
            result = self._run_on_workers(run_main, jobs(self.threads_per_stream), call)
        return self._end(call, trace, ran is not None, result)

    def _main_job(
        self, code: GeneratedCode, inputs: list[Any], call: Call, trace: CallTrace | None
    ) -> Callable[[], Any]:
        """The main stream's steps for one call, to run on the calling thread."""
        fn, slots, events = code.fn, call.slots, call.events

        def run_main() -> Any:
            _inside.call = True
            try:
                if trace is None:
                    return fn(inputs, slots, events, call)
                return fn(inputs, slots, events, call, {None: trace.stream(None)})
            except Aborted:
                return None
            except BaseException as error:
                call.fail(error, code.locate(error))
                return None
            finally:
                _inside.call = False

        return run_main

    def _side_job(
        self,
        side: int,
        inputs: list[Any],
        call: Call,
        caller: CallerState,
        trace: CallTrace | None,
        threads: int | None,
    ) -> Job:
        """Side stream ``side``'s job for one call, run under ``caller``'s thread state with
        ``threads`` intra-op threads (``None`` inside a parallel region, where every torch op
        runs on its one thread). It returns the event of its last record, left out of its code,
        for its thread to set after letting go of the GIL (None where it failed or was
        traced: its traced code records it)."""
        stream = self.sides[side][1]
        code = stream.code if trace is None else stream.traced.get()
        final = None
        if trace is None and stream.final_event is not None:
            final = call.events[stream.final_event]
        mkl = self._mkl
        with_carrier = self._carrier

        def job() -> Any:
            _inside.call = True
            ended = final
            try:
                if threads is not None:
                    set_intra_op_threads(threads)
                    if mkl is not None:
                        mkl(threads)
                args: tuple[Any, ...] = (inputs, call.slots, call.events, call)
                if trace is not None:
                    if threads is None:
                        _name_team_thread()
                    args = (*args, {code.label: trace.stream(code.label)})
                if with_carrier is not None:  # the caller's whole thread-local state
                    with_carrier.run(caller.state, code.fn, *args)
                else:
                    run_as_caller(None, caller, code.fn, *args)
            except Aborted:
                ended = None
            except BaseException as error:  # handed to the caller
                call.fail(error, code.locate(error))
                ended = None
            finally:
                _inside.call = False
                call.working[side] = False  # the main stream may take every thread now
                call.done[side].set()
            return ended

        return job

    def _run_on_workers(self, run_main: Callable[[], Any], jobs: list[Job], call: Call) -> Any:
        """Each side stream's job on its worker, the main stream here, with
        ``threads_per_stream`` intra-op threads each; the caller's own count back after."""
        if self.release_openmp_threads:
            # The caller's own torch work leaves its OpenMP team spinning on the cores the
            # side streams are about to need (see airstream.machine.openmp).
            release_idle_threads()
        submit_all([(worker, job) for (worker, _), job in zip(self.sides, jobs, strict=True)])
        # The caller is the main stream's worker: it too runs with threads_per_stream intra-op
        # threads during the call (oversubscribing the cores costs more than streams gain).
        set_intra_op_threads(self.threads_per_stream)
        call.threads_now = self.threads_per_stream
        mkl = self._mkl
        previous = mkl(self.threads_per_stream) if mkl is not None else 0
        try:
            return run_main()
        finally:
            set_intra_op_threads(call.caller_threads)
            if mkl is not None:
                mkl(previous)

    def _end(self, call: Call, trace: CallTrace | None, on_team: bool, result: Any) -> Any:
        """After the main stream: wait for what the join did not (every side stream of a failed
        or traced call; else those whose last step no join waits for), hand the call's context
        back for the next call, and return ``result`` or raise the call's failure."""
        if not on_team:  # the team returns once every stream has
            everything = call.failed or trace is not None
            for side in range(len(self.sides)) if everything else self._unjoined:
                call.done[side].wait(SPIN_NS)
        if trace is not None:
            trace.finish()
        if call.failed:
            raise call.failure()  # dropped: a side stream's worker may still set its event
        self._free.append(call)
        return result
