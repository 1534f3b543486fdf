"""CPU runtime: the main stream on the calling thread, each side stream on its worker thread.

Every stream runs with ``stream_config.threads_per_stream`` intra-op threads, the calling thread
included for the duration of the call (its own setting is restored afterwards).

Every stream's steps become one generated function (``runtime/codegen.py``): a record sets a
per-call event, a wait waits for it. Events are spinning flags (``runtime/handoff.py``: a waiter
spins briefly without the GIL, then sleeps) where that extension is available, else locks. With
flags, a side stream's last record (the one the caller's join waits for) is set by its worker
after it lets go of the GIL, so the caller resumes without waiting for the GIL.

The caller hands each stream the inputs it reads and empties its own argument list; a value one
stream makes and another reads goes through a per-call slot of its own for every (value, reading
stream) pair, which the reader empties when it first reads it: nothing the call computes
outlives its last use on any stream. A call costs one handoff per side
stream, not one per op.

Failure handling: an op that raises on any stream marks the call failed and sets every event of
the call, so no stream stays blocked; streams that wake up to a failed call stop at their next
wait. The caller waits until every side stream of the call has finished, then gets the original
exception, with a note naming the node and the stream. The next call starts clean.
"""

from __future__ import annotations

import _thread
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from airstream.effects import data_inputs
from airstream.openmp import release_idle_threads
from airstream.runtime.codegen import (
    Builder,
    GeneratedCode,
    Hooks,
    Label,
    LazyTraced,
    generate,
    inputs_read,
)
from airstream.runtime.handoff import SPIN_NS, flag_type
from airstream.runtime.trace import CallTrace, StreamTrace, now_ns, tracing_wanted
from airstream.runtime.workers import StreamWorker, submit_all, worker_for
from airstream.schedule.plan import Record, StreamPlan, StreamSteps
from airstream.torch_internals import set_grad_enabled

__all__ = ["CpuExecutor"]


class _Aborted(Exception):
    """Raised inside a stream that wakes up to a call another stream already failed."""


# Events are plain locks, created held: record releases, wait acquires and releases again (so
# every waiter passes). A lock costs a tenth of a threading.Event to make and to signal.
_new_lock = _thread.allocate_lock


def _new_event() -> Any:
    lock = _new_lock()
    lock.acquire()
    return lock


def _set(lock: Any) -> None:
    try:
        lock.release()
    except RuntimeError:  # already set (the call was failed and every event released)
        pass


class _Events:
    """How a call's events are made, set and waited for: spinning flags, or locks created held
    (record releases, wait acquires and releases again, so every waiter passes)."""

    def __init__(self, flag: Any) -> None:
        self.flag = flag

    def new(self) -> Any:
        return self.flag() if self.flag is not None else _new_event()

    def set(self, event: Any) -> None:
        if self.flag is not None:
            event.set()
        else:
            _set(event)

    def wait(self, event: Any) -> None:
        if self.flag is not None:
            event.wait(SPIN_NS)
        else:
            event.acquire()
            _set(event)


class _CallState:
    __slots__ = ("error", "events", "failed", "guard", "kind", "where")

    def __init__(self, events: list[Any], kind: _Events) -> None:
        self.failed = False
        self.error: BaseException | None = None
        self.where = ""
        self.events = events
        self.kind = kind
        self.guard = _new_lock()

    def fail(self, error: BaseException, where: str) -> None:
        with self.guard:
            if not self.failed:
                self.failed, self.error, self.where = True, error, where
        for event in self.events:  # wake every stream of this call
            self.kind.set(event)


def _record(events: list[Any], index: int) -> None:
    events[index].release()


def _wait(events: list[Any], index: int, state: _CallState) -> None:
    lock = events[index]
    lock.acquire()
    _set(lock)
    if state.failed:
        raise _Aborted


def _record_traced(events: list[Any], index: int, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].release()
    trace.sync("record", index, start)


def _wait_traced(events: list[Any], index: int, state: _CallState, trace: StreamTrace) -> None:
    start = now_ns()
    lock = events[index]
    lock.acquire()
    _set(lock)
    trace.sync("wait", index, start)
    if state.failed:
        raise _Aborted


def _record_flag(events: list[Any], index: int) -> None:
    events[index].set()


def _wait_flag(events: list[Any], index: int, state: _CallState) -> None:
    events[index].wait(SPIN_NS)
    if state.failed:
        raise _Aborted


def _record_flag_traced(events: list[Any], index: int, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].set()
    trace.sync("record", index, start)


def _wait_flag_traced(events: list[Any], index: int, state: _CallState, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].wait(SPIN_NS)
    trace.sync("wait", index, start)
    if state.failed:
        raise _Aborted


def _take(slots: list[Any], index: int) -> Any:
    """Read a slot and empty it: the reading stream now holds the only reference."""
    value = slots[index]
    slots[index] = None
    return value


class _Handover:
    """Which values cross streams: a slot per (value, reading stream)."""

    def __init__(self, gm: torch.fx.GraphModule, plan: StreamPlan) -> None:
        stream_of = plan.stream_of()
        output = next(iter(gm.graph.find_nodes(op="output")))
        self.slot: dict[tuple[torch.fx.Node, Label], int] = {}
        self.readers: dict[torch.fx.Node, list[Label]] = {}
        for node, producer in stream_of.items():
            readers: dict[Label, None] = {}
            for user in node.users:
                if user is output:
                    readers[None] = None
                elif user in stream_of and node in data_inputs(user):
                    readers[stream_of[user]] = None
            readers.pop(producer, None)
            for reader in readers:
                self.slot[(node, reader)] = len(self.slot)
            if readers:
                self.readers[node] = list(readers)


class _StreamHooks(Hooks):
    params = ("slots", "events", "state")

    def __init__(self, handover: _Handover, flags: bool) -> None:
        self.handover = handover
        self.flags = flags

    def record(self, b: Builder, label: Label, event: int) -> None:
        trace = b.trace(label)
        events = b.params["events"]
        if trace is None:
            b.call(_record_flag if self.flags else _record, events, event)
        else:
            b.call(_record_flag_traced if self.flags else _record_traced, events, event, trace)

    def wait(self, b: Builder, label: Label, event: int) -> None:
        trace = b.trace(label)
        events, state = b.params["events"], b.params["state"]
        if trace is None:
            b.call(_wait_flag if self.flags else _wait, events, event, state)
        else:
            b.call(_wait_flag_traced if self.flags else _wait_traced, events, event, state, trace)

    def fetch(self, b: Builder, node: torch.fx.Node, label: Label) -> torch.fx.Node:
        return b.call(_take, b.params["slots"], self.handover.slot[(node, label)])

    def produced(self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node) -> None:
        for reader in self.handover.readers.get(node, ()):
            slot = self.handover.slot[(node, reader)]
            b.call(operator.setitem, b.params["slots"], slot, value)


def _picker(indices: Sequence[int]) -> Callable[[list[Any]], list[Any]]:
    """``args -> [args[i] for i in indices]``, in C where it can be."""
    if not indices:
        return lambda args: []
    if len(indices) == 1:
        (index,) = indices
        return lambda args: [args[index]]
    get = operator.itemgetter(*indices)
    return lambda args: list(get(args))


class _Stream:
    """One stream's generated code (plain, and traced on first need) and the inputs it reads.

    With flags, a side stream whose last step is a record leaves that record out of its plain
    code: ``final_event`` names it, and the worker sets it once it has let go of the GIL."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        program: StreamSteps,
        handover: _Handover,
        main: bool,
        flags: bool,
    ) -> None:
        self.label = program.label
        steps = [(program.label, step) for step in program.steps]
        reads = inputs_read(gm, steps, returns=main)
        self.pick = _picker(list(reads.values()))
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
                hooks=_StreamHooks(handover, flags),
                returns=main,
                traced=traced,
                name=name,
                label=program.label,
            )

        self.code = build(traced=False)
        self.traced = LazyTraced(lambda: build(traced=True))


class CpuExecutor:
    """Boxed callable running a StreamPlan with one worker thread per side stream."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        plan: StreamPlan,
        threads_per_stream: int,
        *,
        release_openmp_threads: bool = True,
    ) -> None:
        self._boxed_call = True  # instance attribute: survives functools.wraps (see serial.py)
        self.plan = plan
        self.threads_per_stream = threads_per_stream
        self.release_openmp_threads = release_openmp_threads
        self._events = _Events(flag_type())
        flags = self._events.flag is not None
        handover = _Handover(gm, plan)
        self._num_slots = len(handover.slot)
        self._num_events = max((s.event for s in plan.syncs), default=-1) + 1
        self.main = _Stream(gm, plan.stream(None), handover, main=True, flags=flags)
        self.sides: tuple[tuple[StreamWorker, _Stream], ...] = tuple(
            (worker_for(str(s.label)), _Stream(gm, s, handover, main=False, flags=flags))
            for s in plan.side_streams
            if s.runs
        )

    @property
    def code(self) -> str:
        """The generated code of every stream."""
        parts = [f"# stream main\n{self.main.code.module.code.strip()}"]
        parts += [f"# stream {s.label}\n{s.code.module.code.strip()}" for _, s in self.sides]
        return "\n\n".join(parts)

    def _job(
        self,
        code: GeneratedCode,
        inputs: list[Any],
        slots: list[Any],
        state: _CallState,
        done: Any,
        grad: bool,
        trace: CallTrace | None,
        final: Any,
    ) -> Callable[[], Any]:
        """The side stream's job for one call; it returns ``final`` (the event of its last
        record, left out of its code) for its worker to set after letting go of the GIL."""
        threads = self.threads_per_stream
        kind = self._events

        def job() -> Any:
            try:
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
                set_grad_enabled(grad)  # grad mode is per thread: follow the caller
                if trace is None:
                    code.fn(inputs, slots, state.events, state)
                else:
                    code.fn(
                        inputs, slots, state.events, state, {code.label: trace.stream(code.label)}
                    )
            except _Aborted:
                pass
            except BaseException as error:  # handed to the caller
                state.fail(error, code.locate(error))
            finally:
                kind.set(done)
            return final

        return job

    def __call__(self, args: list[Any]) -> Any:
        trace = CallTrace() if tracing_wanted() else None
        main = self.main.code if trace is None else self.main.traced.get()
        kind = self._events
        events = [kind.new() for _ in range(self._num_events)]
        state = _CallState(events, kind)
        slots: list[Any] = [None] * self._num_slots
        grad = torch.is_grad_enabled()
        done = [kind.new() for _ in self.sides]
        jobs = []
        for i, (worker, stream) in enumerate(self.sides):
            code = stream.code if trace is None else stream.traced.get()
            final = None
            if trace is None and stream.final_event is not None:
                final = events[stream.final_event]
            job = self._job(code, stream.pick(args), slots, state, done[i], grad, trace, final)
            jobs.append((worker, job))
        main_inputs = self.main.pick(args)
        args.clear()  # the boxed convention: every input now lives only where it is read
        if self.release_openmp_threads:
            # The caller's own torch work leaves its OpenMP team spinning on the cores the side
            # streams are about to need (see airstream.openmp).
            release_idle_threads()
        submit_all(jobs)
        del jobs
        # The caller is the main stream's worker: it too runs with threads_per_stream intra-op
        # threads during the call (oversubscribing the cores costs more than streams gain).
        caller_threads = torch.get_num_threads()
        if caller_threads != self.threads_per_stream:
            torch.set_num_threads(self.threads_per_stream)
        try:
            if trace is None:
                result = main.fn(main_inputs, slots, events, state)
            else:
                result = main.fn(main_inputs, slots, events, state, {None: trace.stream(None)})
        except _Aborted:
            result = None
        except BaseException as error:
            state.fail(error, main.locate(error))
            result = None
        finally:
            if caller_threads != self.threads_per_stream:
                torch.set_num_threads(caller_threads)
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
            raise failure
        # Normal path: the plan's join already waited for every side stream's last step.
        return result
