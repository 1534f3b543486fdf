"""The steps a CPU stream's generated code calls at a record and at a wait: set the call's flag
for the event, or wait for it (``runtime/call.py``, ``runtime/handoff.py``); each plain, and
traced for the profiler. A wait that wakes up to a failed call raises :class:`Aborted`.
"""

from __future__ import annotations

from typing import Any

from airstream.runtime.call import Aborted, Call
from airstream.runtime.handoff import SPIN_NS
from airstream.runtime.trace import StreamTrace, now_ns

__all__ = ["record", "record_traced", "wait", "wait_traced"]


def record(events: list[Any], index: int) -> None:
    events[index].set()


def wait(events: list[Any], index: int, call: Call) -> None:
    events[index].wait(SPIN_NS)
    if call.failed:
        raise Aborted


def record_traced(events: list[Any], index: int, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].set()
    trace.sync("record", index, start)


def wait_traced(events: list[Any], index: int, call: Call, trace: StreamTrace) -> None:
    start = now_ns()
    events[index].wait(SPIN_NS)
    trace.sync("wait", index, start)
    if call.failed:
        raise Aborted
