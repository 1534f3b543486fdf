"""CPU runtime: the main stream on the calling thread, each side stream on its worker thread.

Every stream runs with ``stream_config.threads_per_stream`` intra-op threads, the calling thread
included for the duration of the call (its own setting is restored afterwards).

Every stream's steps become one FX-generated function (runs are the graph's own op calls; a record
sets a per-call ``threading.Event``; a wait blocks on one; values that cross streams go through a
per-call slot list), so a call costs one handoff per side stream, not one per op.

Failure handling: an op that raises on any stream marks the call failed and sets every event of
the call, so no stream stays blocked; streams that wake up to a failed call stop at their next
wait. The caller waits until every side stream of the call has finished, then gets the original
exception, with a note naming the node and the stream. The next call starts clean.
"""

from __future__ import annotations

import _thread
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.nodes import describe
from airstream.ops.library import wait_tensor
from airstream.runtime.codegen import emit_op
from airstream.runtime.trace import CallTrace, StreamTrace, now_ns, tracing_wanted
from airstream.runtime.workers import StreamWorker, submit_all, worker_for
from airstream.schedule.plan import Record, Run, StreamPlan, StreamSteps, Wait
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


class _CallState:
    __slots__ = ("error", "events", "failed", "guard", "where")

    def __init__(self, events: list[Any]) -> None:
        self.failed = False
        self.error: BaseException | None = None
        self.where = ""
        self.events = events
        self.guard = _new_lock()

    def fail(self, error: BaseException, where: str) -> None:
        with self.guard:
            if not self.failed:
                self.failed, self.error, self.where = True, error, where
        for event in self.events:  # wake every stream of this call
            _set(event)


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


@dataclass(frozen=True)
class _StreamCode:
    label: str | None
    module: torch.fx.GraphModule
    fn: Callable[..., Any]
    nodes: tuple[torch.fx.Node, ...]

    def locate(self, error: BaseException) -> str:
        """Name the node of this stream's code that raised ``error``."""
        # FX keeps a map from generated-code line (counted from the prologue) to node index.
        lineno_map = getattr(self.module, "_lineno_map", None) or {}
        prologue = getattr(self.module, "_prologue_start", 0)
        filename = self.module.forward.__code__.co_filename
        tb = error.__traceback__
        node = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                index = lineno_map.get(tb.tb_lineno - prologue)
                if index is not None and index < len(self.nodes):
                    node = self.nodes[index]
            tb = tb.tb_next
        stream = "the main stream" if self.label is None else f"stream {self.label!r}"
        if node is None:
            return stream
        return f"{describe(node)}, on {stream}"


def _generate(
    gm: torch.fx.GraphModule,
    program: StreamSteps,
    input_index: dict[torch.fx.Node, int],
    slot_of: dict[torch.fx.Node, int],
    is_main: bool,
    traced: bool = False,
) -> _StreamCode:
    by_name = {n.name: n for n in gm.graph.nodes}
    graph = torch.fx.Graph()
    args = graph.placeholder("args")
    slots = graph.placeholder("slots")
    events = graph.placeholder("events")
    state = graph.placeholder("state")
    trace = graph.placeholder("trace") if traced else None
    env: dict[torch.fx.Node, torch.fx.Node] = {}

    def local(node: torch.fx.Node) -> torch.fx.Node:
        if node not in env:
            if node.op == "placeholder":
                env[node] = graph.call_function(operator.getitem, (args, input_index[node]))
            elif node.op == "get_attr":
                env[node] = graph.get_attr(str(node.target))
            else:  # produced on another stream; read after this stream's waits
                env[node] = graph.call_function(operator.getitem, (slots, slot_of[node]))
        return env[node]

    for step in program.steps:
        if isinstance(step, Run):
            node = by_name[step.node]
            if node.target is wait_tensor:
                env[node] = local(node.args[0])  # identity: only the ordering mattered
            else:
                env[node] = emit_op(graph, node, local, trace)
            if node in slot_of:
                graph.call_function(operator.setitem, (slots, slot_of[node], env[node]))
        elif isinstance(step, Record):
            if trace is None:
                graph.call_function(_record, (events, step.event))
            else:
                graph.call_function(_record_traced, (events, step.event, trace))
        elif isinstance(step, Wait):
            if trace is None:
                graph.call_function(_wait, (events, step.event, state))
            else:
                graph.call_function(_wait_traced, (events, step.event, state, trace))
    if is_main:
        output = next(iter(gm.graph.find_nodes(op="output")))
        graph.output(torch.fx.map_arg(output.args[0], local))
    else:
        graph.output(None)
    name = "main" if program.label is None else program.label
    suffix = "_traced" if traced else ""
    module = torch.fx.GraphModule(gm, graph, class_name=f"AirstreamStream_{_ident(name)}{suffix}")
    return _StreamCode(program.label, module, module.forward, tuple(module.graph.nodes))


def _ident(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _cross_stream_values(gm: torch.fx.GraphModule, plan: StreamPlan) -> dict[torch.fx.Node, int]:
    """Slot index for every value produced on one stream and read on another (or returned)."""
    stream_of = {name: s.label for s in plan.streams for name in s.runs}
    slot_of: dict[torch.fx.Node, int] = {}
    for node in gm.graph.nodes:
        if node.name not in stream_of:
            continue
        producer = stream_of[node.name]
        for user in node.users:
            if user.op == "output":
                consumer_stream: Any = None
            elif user.name in stream_of:
                consumer_stream = stream_of[user.name]
            else:
                continue
            if consumer_stream != producer and node not in slot_of:
                slot_of[node] = len(slot_of)
    # wait_tensor results are aliases: a consumer on another stream reads the aliased value,
    # which the producer of the alias must publish.
    for node in list(slot_of):
        source = node
        while source.target is wait_tensor:
            source = source.args[0]
            if source.name in stream_of and source not in slot_of:
                slot_of[source] = len(slot_of)
    return slot_of


class CpuExecutor:
    """Boxed callable running a StreamPlan with one worker thread per side stream."""

    def __init__(self, gm: torch.fx.GraphModule, plan: StreamPlan, threads_per_stream: int) -> None:
        self._boxed_call = True  # instance attribute: survives functools.wraps (see serial.py)
        self.plan = plan
        self.threads_per_stream = threads_per_stream
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        input_index = {node: i for i, node in enumerate(placeholders)}
        slot_of = _cross_stream_values(gm, plan)
        self._num_slots = len(slot_of)
        self._num_events = max((s.event for s in plan.syncs), default=-1) + 1
        self.main = _generate(gm, plan.stream(None), input_index, slot_of, is_main=True)
        self.main_traced = _generate(
            gm, plan.stream(None), input_index, slot_of, is_main=True, traced=True
        )
        programs = [s for s in plan.side_streams if s.runs]
        self.sides: tuple[tuple[StreamWorker, _StreamCode], ...] = tuple(
            (worker_for(s.label), _generate(gm, s, input_index, slot_of, is_main=False))
            for s in programs
        )
        self.sides_traced: tuple[tuple[StreamWorker, _StreamCode], ...] = tuple(
            (worker_for(s.label), _generate(gm, s, input_index, slot_of, False, traced=True))
            for s in programs
        )

    @property
    def code(self) -> str:
        """The generated code of every stream."""
        parts = [f"# stream main\n{self.main.module.code.strip()}"]
        parts += [f"# stream {code.label}\n{code.module.code.strip()}" for _, code in self.sides]
        return "\n\n".join(parts)

    def _job(
        self,
        code: _StreamCode,
        args: Sequence[Any],
        slots: list[Any],
        state: _CallState,
        done: Any,
        grad: bool,
        trace: CallTrace | None,
    ) -> Callable[[], None]:
        threads = self.threads_per_stream

        def job() -> None:
            try:
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
                set_grad_enabled(grad)  # grad mode is per thread: follow the caller
                if trace is None:
                    code.fn(args, slots, state.events, state)
                else:
                    code.fn(args, slots, state.events, state, trace.stream(code.label))
            except _Aborted:
                pass
            except BaseException as error:  # handed to the caller
                state.fail(error, code.locate(error))
            finally:
                done.release()

        return job

    def __call__(self, args: list[Any]) -> Any:
        trace = CallTrace() if tracing_wanted() else None
        main, sides = (
            (self.main, self.sides)
            if trace is None
            else (
                self.main_traced,
                self.sides_traced,
            )
        )
        events = [_new_event() for _ in range(self._num_events)]
        state = _CallState(events)
        slots: list[Any] = [None] * self._num_slots
        grad = torch.is_grad_enabled()
        done = [_new_event() for _ in sides]
        submit_all(
            [
                (worker, self._job(code, args, slots, state, done[i], grad, trace))
                for i, (worker, code) in enumerate(sides)
            ]
        )
        # The caller is the main stream's worker: it too runs with threads_per_stream intra-op
        # threads during the call (oversubscribing the cores costs more than streams gain).
        caller_threads = torch.get_num_threads()
        if caller_threads != self.threads_per_stream:
            torch.set_num_threads(self.threads_per_stream)
        try:
            if trace is None:
                result = main.fn(args, slots, events, state)
            else:
                result = main.fn(args, slots, events, state, trace.stream(None))
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
            for lock in done:
                lock.acquire()
        if trace is not None:
            trace.finish()
        if state.failed:
            error = state.error
            assert error is not None
            error.add_note(f"airstream: raised by {state.where}")
            raise error
        # Normal path: the plan's join already waited for every side stream's last step.
        return result
