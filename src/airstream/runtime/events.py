"""The CPU runtime's per-call events and the steps that set and wait for them.

An event is a spinning flag (``runtime/handoff.py``) where that extension is available, else a
plain lock created held: record releases it, wait acquires and releases it again, so every
waiter passes (a lock costs a tenth of a ``threading.Event`` to make and to signal). A call that
fails sets every one of its events, so no stream stays blocked; a stream that wakes up to a
failed call raises :class:`Aborted` at its next wait.
"""

from __future__ import annotations

import _thread
from typing import Any

from airstream.runtime.handoff import SPIN_NS
from airstream.runtime.trace import StreamTrace, now_ns

__all__ = [
    "Aborted",
    "CallObjects",
    "CallState",
    "Events",
    "new_lock",
    "record",
    "record_flag",
    "record_flag_traced",
    "record_traced",
    "wait",
    "wait_flag",
    "wait_flag_traced",
    "wait_traced",
]

new_lock = _thread.allocate_lock


class Aborted(Exception):
    """Raised inside a stream that wakes up to a call another stream already failed."""


def _new_held_lock() -> Any:
    lock = new_lock()
    lock.acquire()
    return lock


def _release(lock: Any) -> None:
    try:
        lock.release()
    except RuntimeError:  # already set (the call was failed and every event released)
        pass


class Events:
    """How a call's events are made, set and waited for: spinning flags (``flag`` is their
    class), or locks created held where ``flag`` is ``None``."""

    def __init__(self, flag: Any) -> None:
        self.flag = flag

    def new(self) -> Any:
        return self.flag() if self.flag is not None else _new_held_lock()

    def set(self, event: Any) -> None:
        if self.flag is not None:
            event.set()
        else:
            _release(event)

    def wait(self, event: Any) -> None:
        if self.flag is not None:
            event.wait(SPIN_NS)
        else:
            event.acquire()
            _release(event)


class CallState:
    """One call's events, whether (where, with what error) it failed, and its threads: the
    intra-op threads its caller had (``caller_threads``: what the main stream gets back where
    no other stream works), the main stream's count now (``threads_now``) and whether each side
    stream is working (``working``: not in a wait, not finished)."""

    __slots__ = (
        "caller_threads",
        "error",
        "events",
        "failed",
        "guard",
        "kind",
        "threads_now",
        "where",
        "working",
    )

    def __init__(
        self, events: list[Any], kind: Events, caller_threads: int = 1, sides: int = 0
    ) -> None:
        self.caller_threads = caller_threads
        self.threads_now = caller_threads
        self.working = [True] * sides
        self.failed = False
        self.error: BaseException | None = None
        self.where = ""
        self.events = events
        self.kind = kind
        self.guard = new_lock()

    def reset(self, caller_threads: int) -> None:
        """As new, for a later call reusing this state (no thread of the last call holds it)."""
        self.failed = False
        self.error = None
        self.where = ""
        self.caller_threads = self.threads_now = caller_threads
        working = self.working
        for side in range(len(working)):
            working[side] = True

    def fail(self, error: BaseException, where: str) -> None:
        with self.guard:
            if not self.failed:
                self.failed, self.error, self.where = True, error, where
        for event in self.events:  # wake every stream of this call
            self.kind.set(event)


class CallObjects:
    """One call's events, its side streams' done flags, its state and its value slots: made
    once, and reset for a later call once no thread of this one can touch them again."""

    __slots__ = ("done", "events", "slots", "state")

    def __init__(self, kind: Events, events: int, sides: int, slots: int, threads: int) -> None:
        self.events = [kind.new() for _ in range(events)]
        self.done = [kind.new() for _ in range(sides)]
        self.state = CallState(self.events, kind, threads, sides)
        self.slots: list[Any] = [None] * slots

    def reset(self, caller_threads: int) -> None:
        for event in self.events:
            event.clear()
        for event in self.done:
            event.clear()
        self.state.reset(caller_threads)
        slots = self.slots
        for index in range(len(slots)):
            slots[index] = None


# The steps the generated code calls: lock events, flag events, each plain and traced.


def record(events: list[Any], index: int) -> None:
    _release(events[index])  # set already where another stream failed the call


def wait(events: list[Any], index: int, state: CallState) -> None:
    lock = events[index]
    lock.acquire()
    _release(lock)
    if state.failed:
        raise Aborted


def record_traced(events: list[Any], index: int, trace: StreamTrace) -> None:
    start = now_ns()
    _release(events[index])
    trace.sync("record", index, start)


def wait_traced(events: list[Any], index: int, state: CallState, trace: StreamTrace) -> None:
    start = now_ns()
    lock = events[index]
    lock.acquire()
    _release(lock)
    trace.sync("wait", index, start)
    if state.failed:
        raise Aborted


def record_flag(events: list[Any], index: int) -> None:
    events[index].set()


def wait_flag(events: list[Any], index: int, state: CallState) -> None:
    events[index].wait(SPIN_NS)
    if state.failed:
        raise Aborted


def record_flag_traced(events: list[Any], index: int, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].set()
    trace.sync("record", index, start)


def wait_flag_traced(events: list[Any], index: int, state: CallState, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].wait(SPIN_NS)
    trace.sync("wait", index, start)
    if state.failed:
        raise Aborted
