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

Every stream's steps become one generated function (``runtime/codegen.py``): a record sets a
per-call event, a wait waits for it. Events are spinning flags (``runtime/handoff.py``: a waiter
spins briefly without the GIL, then sleeps) where that extension is available, else locks. With
flags, a side stream's last record (the one the caller's join waits for) is set by its worker
after it lets go of the GIL, so the caller resumes without waiting for the GIL.

The caller hands each stream the inputs it reads and empties its own argument list; a value one
stream makes and another reads goes through a per-call slot of its own for every (value, reading
stream) pair, which the reader empties when it first reads it: nothing the call computes
outlives its last use on any stream. A call costs one handoff per side
stream, not one per op. A call's events, state and slots (:class:`CallObjects`) are made once
and reset for a later call, where they are flags and no thread of the call can touch them after
it returns (locks, made held, are made per call; a failed call's objects are dropped).

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

import operator
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.fx

from airstream.openmp import release_idle_threads, set_intra_op_threads
from airstream.runtime import events as ev
from airstream.runtime.codegen import (
    Builder,
    GeneratedCode,
    Hooks,
    Label,
    LazyTraced,
    generate,
    inputs_read,
)
from airstream.runtime.events import Aborted, CallObjects, CallState, Events
from airstream.runtime.handoff import flag_type, team_runner
from airstream.runtime.serial import SerialExecutor
from airstream.runtime.slots import Handover, picker, take
from airstream.runtime.thread_state import carrier
from airstream.runtime.threads import Switching, idle, wake, working
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.runtime.workers import StreamWorker, submit_all, worker_for
from airstream.schedule.plan import Record, StreamPlan, StreamSteps
from airstream.torch_internals import mkl_thread_setter, require, set_grad_enabled

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


class _CallerState(NamedTuple):
    """The thread state a call's side streams run under: the caller's whole torch thread-local
    state (``state``, from the thread-state extension), or where that is unavailable its grad
    and inference mode."""

    state: Any
    grad: bool
    inference: bool


class _StreamHooks(Hooks):
    params = ("slots", "events", "state")

    def __init__(
        self,
        handover: Handover,
        flags: bool,
        switching: Switching | None = None,
        side: int | None = None,
    ) -> None:
        self.handover = handover
        self.flags = flags
        self.switching = switching  # None: every stream keeps threads_per_stream for the call
        self.side = side  # a side stream's index in the call's ``working`` flags
        self._alone = False  # the call starts the main stream on its shared threads

    def before_op(self, b: Builder, label: Label, node: torch.fx.Node) -> None:
        switching = self.switching
        alone = switching.plan.get(node) if switching is not None and label is None else None
        if switching is None or alone is None:
            return  # an op whose threads do not matter runs on whatever count is set
        if alone:
            if not self._alone:  # once per run of such ops
                b.call(switching.threads.alone, b.params["state"])
                self._alone = True
        else:
            b.call(switching.threads.now, b.params["state"])
            self._alone = False

    def record(self, b: Builder, label: Label, event: int) -> None:
        trace = b.trace(label)
        events = b.params["events"]
        woken = self.switching.waiters.get(event) if self.switching is not None else None
        if woken:
            b.call(wake, b.params["state"], woken)
        if trace is None:
            b.call(ev.record_flag if self.flags else ev.record, events, event)
        else:
            b.call(ev.record_flag_traced if self.flags else ev.record_traced, events, event, trace)

    def wait(self, b: Builder, label: Label, event: int) -> None:
        trace = b.trace(label)
        events, state = b.params["events"], b.params["state"]
        counted = self.switching is not None and self.side is not None
        if counted:  # the main stream may take every thread while this one waits
            b.call(idle, state, self.side)
        if trace is None:
            b.call(ev.wait_flag if self.flags else ev.wait, events, event, state)
        else:
            b.call(
                ev.wait_flag_traced if self.flags else ev.wait_traced, events, event, state, trace
            )
        if counted:
            b.call(working, state, self.side)

    def fetch(self, b: Builder, node: torch.fx.Node, label: Label) -> torch.fx.Node:
        return b.call(take, b.params["slots"], self.handover.slot[(node, label)])

    def produced(self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node) -> None:
        for reader in self.handover.readers.get(node, ()):
            slot = self.handover.slot[(node, reader)]
            b.call(operator.setitem, b.params["slots"], slot, value)


class _Stream:
    """One stream's generated code (plain, and traced on first need) and the inputs it reads.

    With flags, a side stream whose last step is a record leaves that record out of its plain
    code: ``final_event`` names it, and the worker sets it once it has let go of the GIL."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        program: StreamSteps,
        handover: Handover,
        main: bool,
        flags: bool,
        switching: Switching | None = None,
        side: int | None = None,
    ) -> None:
        self.label = program.label
        steps = [(program.label, step) for step in program.steps]
        reads = inputs_read(gm, steps, returns=main)
        self.pick = picker(list(reads.values()))
        own = {n: i for i, n in enumerate(reads)}
        name = f"AirstreamStream_{'main' if main else program.label}"  # generate() sanitizes
        last = program.steps[-1] if program.steps else None
        self.final_event = last.event if flags and not main and isinstance(last, Record) else None
        plain = steps[:-1] if self.final_event is not None else steps

        def build(traced: bool) -> GeneratedCode:
            return generate(
                gm,
                steps if traced else plain,
                inputs=own,
                hooks=_StreamHooks(handover, flags, switching, side),
                returns=main,
                traced=traced,
                name=name,
                label=program.label,
            )

        self.code = build(traced=False)
        self.traced = LazyTraced(lambda: build(traced=True))


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
        self._events = Events(flag_type())
        flags = self._events.flag is not None
        handover = Handover(gm, plan)
        self._num_slots = len(handover.slot)
        self._num_events = max((s.event for s in plan.syncs), default=-1) + 1
        sides = [s for s in plan.side_streams if s.runs]
        # MKL's own per-thread count, for the worker-thread path
        self._mkl = None
        if sides:
            require("cpu-streams")
            self._mkl = mkl_thread_setter()
        # The main stream's ops get the caller's threads back where no other stream works.
        switching = Switching.of(plan, sides, threads_per_stream, self._mkl)
        self.thread_plan = dict(switching.plan) if switching is not None else {}
        # One thread per stream on the caller's OpenMP team, where streams run one intra-op
        # thread each (inside a parallel region every torch op runs on its one thread) and the
        # main stream has no step to run alone on more.
        wanted = openmp_team and flags and threads_per_stream == 1 and switching is None
        team = team_runner() if wanted else None
        self.main = _Stream(gm, plan.stream(None), handover, True, flags, switching)
        self.sides: tuple[tuple[StreamWorker, _Stream], ...] = tuple(
            (worker_for(str(s.label)), _Stream(gm, s, handover, False, flags, switching, i))
            for i, s in enumerate(sides)
        )
        self._team = team if self.sides else None
        # Side streams run under the caller's thread-local state (runtime/thread_state.py).
        self._carrier = carrier() if self.sides else None
        # Each call's objects, reused by later calls where they are spinning flags (locks are
        # made held: a used one cannot be reset) and no thread can touch them after the call
        # (see __call__). One per concurrent call: a caller takes one, and gives it back.
        self._reuse = flags
        self._ends_with_records = all(stream.final_event is not None for _, stream in self.sides)
        self._free: list[CallObjects] = []
        self._gm = gm
        self._serial: SerialExecutor | None = None

    def _nested(self) -> SerialExecutor:
        """This graph on one thread, for a call made from inside another call's stream."""
        if self._serial is None:
            self._serial = SerialExecutor(self._gm, self.plan)
        return self._serial

    def _call_objects(self, caller_threads: int) -> CallObjects:
        """A free call's objects, reset, or new ones (list.pop is atomic: concurrent callers
        never share one)."""
        try:
            objects = self._free.pop()
        except IndexError:
            return CallObjects(
                self._events,
                self._num_events,
                len(self.sides),
                self._num_slots,
                caller_threads,
            )
        objects.reset(caller_threads)
        return objects

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

    def _job(
        self,
        code: GeneratedCode,
        inputs: list[Any],
        slots: list[Any],
        state: CallState,
        done: Any,
        caller: _CallerState,
        trace: CallTrace | None,
        final: Any,
        threads: int | None,
        side: int,
    ) -> Callable[[], Any]:
        """The side stream's job for one call; it returns ``final`` (the event of its last
        record, left out of its code) for its thread to set after letting go of the GIL.
        ``caller``: the thread state it runs under. ``threads``: the intra-op threads to run
        with (``None`` inside a parallel region, where every torch op runs on its one thread)."""
        kind = self._events
        mkl = self._mkl
        carrier = self._carrier

        def job() -> Any:
            _inside.call = True
            try:
                if threads is not None:
                    set_intra_op_threads(threads)
                    if mkl is not None:
                        mkl(threads)
                args: tuple[Any, ...] = (inputs, slots, state.events, state)
                if trace is not None:
                    if threads is None:
                        _name_team_thread()
                    args = (*args, {code.label: trace.stream(code.label)})
                if carrier is not None:  # under the caller's whole thread-local state
                    carrier.run(caller.state, code.fn, *args)
                else:  # grad and inference mode, each per thread: follow the caller
                    set_grad_enabled(caller.grad)
                    if caller.inference:
                        with torch.inference_mode():
                            code.fn(*args)
                    else:
                        code.fn(*args)
            except Aborted:
                pass
            except BaseException as error:  # handed to the caller
                state.fail(error, code.locate(error))
            finally:
                _inside.call = False
                state.working[side] = False  # the main stream may take every thread now
                kind.set(done)
            return final

        return job

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
        kind = self._events
        caller_threads = torch.get_num_threads()
        objects = self._call_objects(caller_threads)
        events, done, state, slots = objects.events, objects.done, objects.state, objects.slots
        carrier = self._carrier
        if carrier is not None:
            caller = _CallerState(carrier.capture(), False, False)
        else:
            caller = _CallerState(None, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        sides = []
        for worker, stream in self.sides:
            code = stream.code if trace is None else stream.traced.get()
            final = None
            if trace is None and stream.final_event is not None:
                final = events[stream.final_event]
            sides.append((worker, code, stream.pick(args), final))
        main_inputs = self.main.pick(args)
        args.clear()  # the boxed convention: every input now lives only where it is read

        def run_main() -> Any:
            _inside.call = True
            try:
                if trace is None:
                    return main.fn(main_inputs, slots, events, state)
                return main.fn(main_inputs, slots, events, state, {None: trace.stream(None)})
            except Aborted:
                return None
            except BaseException as error:
                state.fail(error, main.locate(error))
                return None
            finally:
                _inside.call = False

        def jobs(threads: int | None) -> list[Callable[[], Any]]:
            return [
                self._job(code, inputs, slots, state, done[i], caller, trace, final, threads, i)
                for i, (_, code, inputs, final) in enumerate(sides)
            ]

        ran = None
        # A team no larger than the one the caller's own torch ops use: a larger one would
        # leave OpenMP managing more threads than it has cores, which throttles its spinning
        # for every later parallel op of the process.
        if self._team is not None and caller_threads > len(sides):
            ran = self._team((run_main, *jobs(None)))
        if ran is not None:
            result = ran[0]
        else:
            if self.release_openmp_threads:
                # The caller's own torch work leaves its OpenMP team spinning on the cores the
                # side streams are about to need (see airstream.openmp).
                release_idle_threads()
            submit_all(
                [
                    (worker, job)
                    for (worker, *_), job in zip(sides, jobs(self.threads_per_stream), strict=True)
                ]
            )
            # The caller is the main stream's worker: it too runs with threads_per_stream
            # intra-op threads during the call (oversubscribing the cores costs more than
            # streams gain).
            set_intra_op_threads(self.threads_per_stream)
            state.threads_now = self.threads_per_stream
            mkl = self._mkl
            previous = mkl(self.threads_per_stream) if mkl is not None else 0
            try:
                result = run_main()
            finally:
                set_intra_op_threads(caller_threads)
                if mkl is not None:
                    mkl(previous)
        if state.failed or trace is not None:
            # Failed: the join was skipped or poisoned. Traced: the trace must be complete.
            # Either way, let every side stream of this call finish first.
            for event in done:
                kind.wait(event)
        if trace is not None:
            trace.finish()
        if state.failed:
            failure = state.error
            assert failure is not None
            failure.add_note(f"airstream: raised by {state.where}")
            raise failure  # this call's objects are dropped, not reused
        # Normal path: the plan's join already waited for every side stream's last step. No
        # thread touches this call's objects again: the team has returned; a side stream's
        # last record, set by its worker after its job's end, or a wait for its done flag was
        # the last thing the caller waited for. Otherwise (locks), they are dropped.
        if self._reuse and (ran is not None or trace is not None or self._ends_with_records):
            self._free.append(objects)
        return result
