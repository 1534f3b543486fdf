"""One call of a CPU executor's graph: the context every stream of the call shares.

A :class:`Call` holds the call's events (a flag per event of the plan, ``runtime/handoff.py``),
a done flag per side stream, the slots through which values cross streams
(``runtime/slots.py``), whether (where, with what error) the call failed, and its threads: the
intra-op threads its caller had (``caller_threads``: what the main stream gets back where no
other stream works), the main stream's count now (``threads_now``) and whether each side stream
is working (``working``: not in a wait, not finished; ``runtime/threads.py``). An executor makes
one per concurrent call and resets it for a later call once no thread of this one can touch it
(a failed call's is dropped: a side stream's thread may still set the event its job left it).

A call that fails sets every event, so no stream stays blocked; a stream that wakes up to a
failed call raises :class:`Aborted` at its next wait (``runtime/events.py``).
"""

from __future__ import annotations

import _thread
from typing import Any

__all__ = ["Aborted", "Call"]


class Aborted(Exception):
    """Raised inside a stream that wakes up to a call another stream already failed."""


class Call:
    """One call's events, done flags, slots, failure and threads (see the module docstring)."""

    __slots__ = (
        "_guard",
        "caller_threads",
        "done",
        "error",
        "events",
        "failed",
        "slots",
        "threads_now",
        "where",
        "working",
    )

    def __init__(self, flag: Any, events: int, sides: int, slots: int) -> None:
        """``flag``: the flag class (``handoff.flag_type()``); ``events``, ``sides``, ``slots``:
        how many the plan has of each."""
        self.events = [flag() for _ in range(events)]
        self.done = [flag() for _ in range(sides)]
        self.slots: list[Any] = [None] * slots
        self.working = [True] * sides
        self.failed = False
        self.error: BaseException | None = None
        self.where = ""
        self.caller_threads = self.threads_now = 1
        self._guard = _thread.allocate_lock()

    def start(self, caller_threads: int) -> None:
        """Ready for a call whose caller runs ``caller_threads`` intra-op threads: every event
        and done flag clear, every slot empty, every side stream working, nothing failed."""
        for event in self.events:
            event.clear()
        for event in self.done:
            event.clear()
        slots = self.slots
        for index in range(len(slots)):
            slots[index] = None
        working = self.working
        for side in range(len(working)):
            working[side] = True
        self.failed = False
        self.error = None
        self.where = ""
        self.caller_threads = self.threads_now = caller_threads

    def fail(self, error: BaseException, where: str) -> None:
        """The op at ``where`` raised ``error``: the first failure is the call's; every event is
        set, so that no stream stays blocked."""
        with self._guard:
            if not self.failed:
                self.failed, self.error, self.where = True, error, where
        for event in self.events:
            event.set()

    def failure(self) -> BaseException:
        """The call's failure, with a note naming the op and the stream."""
        failure = self.error
        assert failure is not None
        failure.add_note(f"airstream: raised by {self.where}")
        return failure
