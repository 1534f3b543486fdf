"""Per-op tracing hooks of the runtimes, off the hot path unless someone listens.

Each executor generates two versions of its code: plain, and traced (every run bracketed by
``op_begin``/``op_end``, waits and records timed). A call picks the traced version only while a
listener is registered (``airstream.profile()``) or ``torch.profiler`` is recording, a check made
once per call, so an unprofiled op pays nothing. Traced calls collect records in a ``CallTrace``
and hand it to the listeners when the call ends.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airstream import torch_internals

__all__ = [
    "CallTrace",
    "OpRecord",
    "SyncRecord",
    "StreamTrace",
    "add_listener",
    "now_ns",
    "remove_listener",
    "tracing_wanted",
]

_listeners: tuple[Callable[[CallTrace], None], ...] = ()  # replaced, never mutated in place
_listeners_lock = threading.Lock()
_call_ids = itertools.count()
now_ns = time.perf_counter_ns
_profiler_enabled = torch_internals.profiler_enabled  # a profiler started from C++ alone: unseen


def add_listener(listener: Callable[[CallTrace], None]) -> None:
    """Receive a CallTrace for every compiled call from now on."""
    global _listeners
    with _listeners_lock:
        _listeners = (*_listeners, listener)


def remove_listener(listener: Callable[[CallTrace], None]) -> None:
    """Stop receiving CallTraces."""
    global _listeners
    with _listeners_lock:
        # ==, not `is`: each access to a bound method makes a new object (they compare equal)
        _listeners = tuple(x for x in _listeners if x != listener)


def tracing_wanted() -> bool:
    """True if this call should run the traced code (checked once per call)."""
    return bool(_listeners) or _profiler_enabled()


@dataclass(frozen=True)
class OpRecord:
    """One executed op: ``stream`` (None = main), FX node ``name``, host start/end in ns;
    ``detail`` says what a max-autotune segment fused and its kernels, ``fused`` names the
    nodes it fused (else ``""`` and ``()``)."""

    stream: str | None
    name: str
    start_ns: int
    end_ns: int
    call: int
    thread: str
    detail: str = ""
    fused: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncRecord:
    """A record (event reached) or a wait (with the time it blocked) on ``stream``."""

    kind: str  # "record" or "wait"
    stream: str | None
    event: int
    start_ns: int
    end_ns: int
    call: int


@dataclass
class CallTrace:
    """Everything one traced call recorded; filled by the streams of the call. Its clock
    (``start_ns``) starts when it is made: executors make it once their traced code exists, so
    generating that code (on the first profiled call) is not counted in the call."""

    call: int = field(default_factory=lambda: next(_call_ids))
    ops: list[OpRecord] = field(default_factory=list)
    syncs: list[SyncRecord] = field(default_factory=list)
    start_ns: int = field(default_factory=now_ns)
    end_ns: int = 0
    emit_ranges: bool = field(default_factory=_profiler_enabled)

    def __post_init__(self) -> None:
        if self.emit_ranges:
            torch_internals.require("profiler")

    def stream(self, label: str | None) -> StreamTrace:
        """The recorder one stream of this call writes to."""
        return StreamTrace(self, label)

    def finish(self) -> None:
        """Close the call and hand it to the listeners."""
        self.end_ns = now_ns()
        for listener in _listeners:
            listener(self)


class StreamTrace:
    """What the traced code of one stream calls (list.append is atomic across threads)."""

    __slots__ = ("call", "label", "prefix", "thread")

    def __init__(self, call: CallTrace, label: str | None) -> None:
        self.call = call
        self.label = label
        self.prefix = "main" if label is None else label
        self.thread = threading.current_thread().name

    def op_begin(self, name: str) -> tuple[int, Any]:
        handle = None
        if self.call.emit_ranges:
            handle = torch_internals.record_function_enter(f"{self.prefix}:{name}")
        return now_ns(), handle

    def op_end(
        self, name: str, token: tuple[int, Any], detail: str = "", fused: tuple[str, ...] = ()
    ) -> None:
        end = now_ns()
        start, handle = token
        if handle is not None:
            torch_internals.record_function_exit(handle)
        thread = threading.current_thread().name
        self.call.ops.append(
            OpRecord(self.label, name, start, end, self.call.call, thread, detail, fused)
        )

    def sync(self, kind: str, event: int, start: int) -> None:
        self.call.syncs.append(SyncRecord(kind, self.label, event, start, now_ns(), self.call.call))


def op_begin(trace: StreamTrace, name: str) -> tuple[int, Any]:
    """Generated code: before an op."""
    return trace.op_begin(name)


def op_end(
    trace: StreamTrace,
    name: str,
    token: tuple[int, Any],
    detail: str = "",
    fused: tuple[str, ...] = (),
) -> None:
    """Generated code: after an op (``detail``, ``fused``: a max-autotune segment's description
    and the nodes it fused)."""
    trace.op_end(name, token, detail, fused)
